"""Lookahead decoding for fastllm: n-gram drafts from a shared trie, verified exactly."""

from fastllm_lookahead.decoder import LookaheadDecoder

__all__ = ["LookaheadDecoder"]
