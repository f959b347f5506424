"""The ``speculative_config`` keys lookahead decoding understands, with their defaults."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class LookaheadConfig:
    """``num_speculative_tokens`` is the seed's NUM_SPECULATIVE_TOKENS (default 6): lower it
    for many concurrent requests, raise it for few.

    ``max_match_tokens``: the longest context suffix looked up in the tries (tried from long
    to short). ``max_pool_nodes``: the memory bound of each trie (about 150 bytes a node).
    ``max_batch_draft_tokens``: the most draft tokens one step verifies over the whole batch.
    ``min_chain_prob``: a sequence proposes k drafts only while its estimated chance that all
    k are accepted stays above this.
    """

    num_speculative_tokens: int = 6
    max_match_tokens: int = 4
    max_pool_nodes: int = 1 << 18
    max_batch_draft_tokens: int = 64
    min_chain_prob: float = 0.3

    @classmethod
    def from_dict(cls, speculative_config: dict[str, Any]) -> LookaheadConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(speculative_config) - known - {"method"}
        if unknown:
            raise ValueError(f"unknown lookahead option(s) {sorted(unknown)}; known: {sorted(known)}")
        config = cls(**{k: v for k, v in speculative_config.items() if k in known})
        if config.num_speculative_tokens < 1 or config.max_match_tokens < 1:
            raise ValueError("need num_speculative_tokens >= 1 and max_match_tokens >= 1")
        if not 0.0 < config.min_chain_prob < 1.0:
            raise ValueError(f"min_chain_prob must lie in (0, 1), got {config.min_chain_prob}")
        return config

    @property
    def trie_depth(self) -> int:
        """A matched suffix plus a full draft must fit on one path of the trie."""
        return self.max_match_tokens + self.num_speculative_tokens
