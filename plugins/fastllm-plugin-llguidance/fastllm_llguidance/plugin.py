"""Registers the ``llguidance`` structured-output backend.

llguidance (and the backend module) is imported only when an engine builds the backend:
this module is imported whenever any registry is read, e.g. by ``fastllm plugins``.
"""

from __future__ import annotations

from typing import Any

from fastllm.registry import hookimpl
from fastllm.structured_output import StructuredOutputBackend


def llguidance_backend(tokenizer: Any, vocab_size: int) -> StructuredOutputBackend:
    """The engine's factory call: a HF (fast) tokenizer and the model's logits width."""
    import llguidance.hf

    from fastllm_llguidance.backend import LLGuidanceBackend

    return LLGuidanceBackend(llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size), vocab_size)


llguidance_backend.preference = 1  # "auto" asks it where xgrammar is not exact


@hookimpl
def register_structured_output_backends() -> dict[str, Any]:
    return {"llguidance": llguidance_backend}
