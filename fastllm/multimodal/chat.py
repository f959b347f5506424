"""OpenAI content parts with images and video: what the chat template sees, and the media.

An ``image_url`` / ``video_url`` part (or vLLM's ``image`` / ``video`` part with the object
itself) becomes ``{"type": "image"}`` / ``{"type": "video"}`` for the template, which renders
the model's placeholder there; its source goes, in order, into the prompt's multimodal data.
"""

from __future__ import annotations

from typing import Any

from fastllm.engine.input_processor import RequestError

PART_MODALITY = {"image_url": "image", "image": "image", "input_image": "image",
                 "video_url": "video", "video": "video"}


def _source(part: dict[str, Any], kind: str) -> Any:
    value = part.get(kind)
    if isinstance(value, dict):
        value = value.get("url")
    if value is None:
        raise RequestError(f"a {kind} content part needs its {kind!r} value")
    return value


def split_media(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, list[Any]]]:
    """Messages for the chat template and the media of their image and video parts."""
    media: dict[str, list[Any]] = {}
    rendered = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            rendered.append(message)
            continue
        parts = []
        for part in content:
            kind = part.get("type")
            if kind == "text":
                parts.append(part)
            elif kind in PART_MODALITY:
                modality = PART_MODALITY[kind]
                media.setdefault(modality, []).append(_source(part, kind))
                parts.append({"type": modality})
            else:
                raise RequestError(f"unsupported content part type {kind!r}")
        rendered.append({**message, "content": parts})
    return rendered, media


def has_media(messages: list[dict[str, Any]]) -> bool:
    return any(isinstance(m.get("content"), list) and any(p.get("type") in PART_MODALITY for p in m["content"])
               for m in messages)
