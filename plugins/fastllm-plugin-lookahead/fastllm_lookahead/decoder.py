"""Lookahead decoding: drafts from n-grams already seen, no draft model.

Two kinds of trie hold what was seen. Each request has its own, over its prompt and its
samples' outputs: copying from the prompt (RAG, quoting, editing) is the common case, so
its matches win ties. One pool shared by all requests holds every answer (plus the end of
its prompt, so an answer's first tokens are found too): the second time a question is
asked, the first answer drafts the second. The longer suffix match wins.

Verification is the engine's (one forward pass, exact acceptance), so drafts change the
speed, never the output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastllm.spec_decode.interface import DraftingSequence
from fastllm_lookahead.config import LookaheadConfig
from fastllm_lookahead.policy import PROBE_MIN_MATCH, AcceptanceTracker, share_drafts
from fastllm_lookahead.trie import Match, TokenTrie, TrieCursor


@dataclass
class RequestTrie:
    """A request's own trie, shared by its ``n`` samples; the cursor stands at the prompt's end."""

    trie: TokenTrie
    prompt_cursor: TrieCursor
    num_seqs: int = 0


@dataclass
class SequenceDrafts:
    """What the decoder keeps per sequence (``seq.spec_state``)."""

    request: RequestTrie
    own_cursor: TrieCursor
    pool_cursor: TrieCursor
    tracker: AcceptanceTracker
    num_fed: int = 0


class LookaheadDecoder:
    """The ``lookahead`` speculative decoder (``fastllm.spec_decode.interface.SpeculativeDecoder``)."""

    def __init__(self, speculative_config: dict[str, Any], engine_config: Any = None) -> None:
        self.config = LookaheadConfig.from_dict(speculative_config)
        self.pool = TokenTrie(self.config.trie_depth, self.config.max_pool_nodes)
        self.requests: dict[str, RequestTrie] = {}
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.num_spec_steps = 0
        self.probe_min_match = min(PROBE_MIN_MATCH, self.config.max_match_tokens)

    def on_prompt(self, seq: DraftingSequence) -> None:
        config = self.config
        request = self.requests.get(seq.request_id)
        if request is None:
            trie, cursor = TokenTrie(config.trie_depth, config.max_pool_nodes), TrieCursor()
            trie.extend(cursor, seq.prompt_token_ids, 0)
            request = self.requests[seq.request_id] = RequestTrie(trie, cursor)
        request.num_seqs += 1
        pool_cursor = TrieCursor()
        self.pool.extend(pool_cursor, seq.prompt_token_ids[-config.max_match_tokens:], 0)
        own_cursor = TrieCursor(list(request.prompt_cursor.frontier), request.prompt_cursor.generation)
        tracker = AcceptanceTracker(config.num_speculative_tokens, config.min_chain_prob)
        seq.spec_state = SequenceDrafts(request, own_cursor, pool_cursor, tracker)

    def wants_drafts(self, seq: DraftingSequence) -> bool:
        """Yes while the sequence's drafts hold well enough; once backed off, only when a probe is
        due and the tokens on the host end in a long enough match: their last ``PROBE_MIN_MATCH``
        were seen before with a token after. A token still pending then likely continues the
        match (copying); checking only the tokens a match could still end in would say yes on
        most steps of free text (any common bigram), and each yes costs the step its overlap."""
        wanted, probe = seq.spec_state.tracker.allowed()
        if not probe:
            return wanted > 0
        context = self._context(seq, self.probe_min_match)
        return seq.spec_state.request.trie.continues(context) or self.pool.continues(context)

    def propose(self, seqs: list[DraftingSequence], max_drafts: list[int]) -> None:
        drafts, priority = [], []
        for seq, room in zip(seqs, max_drafts):
            tracker = seq.spec_state.tracker
            wanted, probe = tracker.allowed()
            match = self._match(seq, min(room, wanted)) if wanted > 0 else Match()
            drafts.append(match.tokens if not probe or match.length >= self.probe_min_match else [])
            priority.append(tracker.acceptance)
        granted = share_drafts([len(d) for d in drafts], priority, self.config.max_batch_draft_tokens)
        for seq, draft, count in zip(seqs, drafts, granted):
            seq.draft_token_ids = draft[:count]

    def on_step(self, seq: DraftingSequence, num_proposed: int, num_accepted: int) -> None:
        state: SequenceDrafts = seq.spec_state
        state.tracker.update(num_proposed, num_accepted)
        self.num_draft_tokens += num_proposed
        self.num_accepted_tokens += num_accepted
        self.num_spec_steps += num_proposed > 0
        output = seq.output_token_ids
        state.request.trie.extend(state.own_cursor, output, state.num_fed)
        self.pool.extend(state.pool_cursor, output, state.num_fed)
        state.num_fed = len(output)

    def on_finished(self, seq: DraftingSequence) -> None:
        state: SequenceDrafts = seq.spec_state
        if state is None:
            return
        seq.spec_state = None
        state.request.num_seqs -= 1
        if state.request.num_seqs == 0:
            del self.requests[seq.request_id]

    def stats(self) -> dict[str, Any]:
        """Engine totals since start-up; ``mean_accepted_length`` counts the token every
        verification step yields on top of its accepted drafts."""
        steps = self.num_spec_steps
        return {
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "num_spec_steps": steps,
            "acceptance_rate": self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0,
            "mean_accepted_length": 1.0 + self.num_accepted_tokens / steps if steps else 1.0,
            "pool_nodes": self.pool.num_nodes,
            "pool_evictions": self.pool.num_evictions,
            "active_requests": len(self.requests),
        }

    def _match(self, seq: DraftingSequence, max_tokens: int) -> Match:
        """The longer suffix match and its continuation: the request's own trie, else the pool."""
        state: SequenceDrafts = seq.spec_state
        longest = self.config.max_match_tokens
        context = self._context(seq, longest)
        own = state.request.trie.match(context, longest, max_tokens)
        if own.length == longest:
            return own
        shared = self.pool.match(context, longest, max_tokens)
        return shared if shared.length > own.length else own

    @staticmethod
    def _context(seq: DraftingSequence, length: int) -> list[int]:
        """The last ``length`` tokens of ``seq`` on the host (fewer only if it has fewer)."""
        output = seq.output_token_ids[-length:]
        return output if len(output) == length else seq.prompt_token_ids[len(output) - length:] + output
