"""Registers the ``xgrammar`` structured-output backend.

xgrammar (and the backend module) is imported only when an engine builds the backend:
this module is imported whenever any registry is read, e.g. by ``fastllm plugins``.
"""

from __future__ import annotations

from typing import Any

from fastllm.registry import hookimpl
from fastllm.structured_output import StructuredOutputBackend


def xgrammar_backend(tokenizer: Any, vocab_size: int) -> StructuredOutputBackend:
    """The engine's factory call: a HF tokenizer and the model's logits width."""
    import xgrammar as xgr

    from fastllm_xgrammar.backend import XGrammarBackend

    return XGrammarBackend(xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size))


xgrammar_backend.preference = 0  # "auto" asks it first: where it is exact, its masks are the cheaper


@hookimpl
def register_structured_output_backends() -> dict[str, Any]:
    return {"xgrammar": xgrammar_backend}
