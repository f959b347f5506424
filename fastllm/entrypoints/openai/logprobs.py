"""The engine's per-position ``{token_id: logprob}`` maps in OpenAI's two logprob layouts.

Each engine map holds the top-k tokens plus the token actually chosen, so the
chosen token's logprob is always there. Tokens are shown as their decoded text.
A token a grammar or a bias masked has logprob -inf, which JSON cannot hold: it is
sent as -9999.0, as OpenAI and vLLM do.
"""

from __future__ import annotations

from typing import Any, Optional

from fastllm.entrypoints.openai.protocol_chat import ChoiceLogprobs, TokenLogprob, TopLogprob
from fastllm.entrypoints.openai.protocol_completion import CompletionLogprobs
from fastllm.outputs import Logprobs

MASKED_LOGPROB = -9999.0


def finite(logprob: float) -> float:
    """-inf and NaN (a row with every token masked) as -9999.0; JSON has no infinities."""
    return logprob if logprob >= MASKED_LOGPROB else MASKED_LOGPROB


def _ranked(entry: Logprobs) -> list[tuple[int, float]]:
    return sorted(((token, finite(lp)) for token, lp in entry.items()), key=lambda item: item[1], reverse=True)


def completion_logprobs(tokenizer: Any, token_ids: list[int], logprobs: list[Optional[Logprobs]],
                        text_offset: int) -> CompletionLogprobs:
    """Legacy layout; ``text_offset`` is where the first token's text starts in the choice's text.

    A position without a map (the first prompt token under ``echo``) gets nulls.
    """
    result = CompletionLogprobs()
    for token_id, entry in zip(token_ids, logprobs):
        token = tokenizer.decode([token_id])
        result.tokens.append(token)
        result.text_offset.append(text_offset)
        result.token_logprobs.append(finite(entry[token_id]) if entry else None)
        result.top_logprobs.append({tokenizer.decode([t]): lp for t, lp in _ranked(entry)} if entry else None)
        text_offset += len(token)
    return result


def chat_logprobs(tokenizer: Any, token_ids: list[int], logprobs: list[Logprobs], top: int) -> ChoiceLogprobs:
    """Chat layout: each chosen token with its ``top`` best alternatives."""
    content = []
    for token_id, entry in zip(token_ids, logprobs):
        alternatives = [TopLogprob(token=(text := tokenizer.decode([t])), logprob=lp, bytes=list(text.encode()))
                        for t, lp in _ranked(entry)[:top]]
        token = tokenizer.decode([token_id])
        content.append(TokenLogprob(token=token, logprob=finite(entry[token_id]), bytes=list(token.encode()),
                                    top_logprobs=alternatives))
    return ChoiceLogprobs(content=content)
