"""Offline tokenizers for the chat tests, and an environment cleared of the matching variables."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast


@pytest.fixture
def make_tokenizer() -> Callable[..., PreTrainedTokenizerFast]:
    """A real HF fast tokenizer built in memory: ``apply_chat_template`` runs as it does for any model."""

    def build(bos: str = "<s>", eos: str = "</s>", chat_template: str | None = None) -> PreTrainedTokenizerFast:
        backend = Tokenizer(models.WordLevel({"<unk>": 0, bos: 1, eos: 2}, unk_token="<unk>"))
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos, eos_token=eos)
        tokenizer.chat_template = chat_template
        return tokenizer

    return build


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONV_TEMPLATE", raising=False)
    monkeypatch.delenv("MODEL_ID", raising=False)
