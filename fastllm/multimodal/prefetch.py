"""Offline generation's media, processed before the first step on a thread pool: decoding,
resizing and normalising release the GIL, and one large image takes tens of milliseconds, so
done one by one they would hold up the whole batch."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

from fastllm.engine.input_processor import RequestError

MEDIA_THREADS = min(16, os.cpu_count() or 1)

Prompt = tuple[Optional[str], Optional[list[int]], Optional[dict[str, Any]]]


def process_prompts_media(engine: Any, prompts: list[Prompt]) -> list[Any]:
    """Per prompt (text, token ids, media): None where it has no media (or the engine processes
    media itself), ``(expanded token ids, MultimodalInputs)``, or the RequestError its media raised."""
    if not hasattr(engine, "process_media") or sum(1 for _, _, media in prompts if media) < 2:
        return [None] * len(prompts)

    def process(prompt: Prompt) -> Any:
        text, token_ids, media = prompt
        if not media:
            return None
        try:
            return engine.process_media(token_ids if token_ids is not None else engine.inputs.tokenize(text), media)
        except (RequestError, TypeError) as exc:
            return exc if isinstance(exc, RequestError) else RequestError(str(exc))

    with ThreadPoolExecutor(MEDIA_THREADS) as pool:
        return list(pool.map(process, prompts))
