"""Incremental detokenization against a full decode of the same tokens (SmolLM2's tokenizer)."""

from __future__ import annotations

import copy

import pytest

from fastllm.engine.detokenizer import StreamDetokenizer, WindowDetokenizer, new_detokenizer

TEXT = ("Plain words, then accents: héllo, naïve; CJK 漢字かな; emoji 😀🚀 and a flag 🇫🇷.\n"
        "<|im_start|>assistant\nTabs\tand  double  spaces, numbers 3.14159, end.<|im_end|>")


@pytest.fixture(scope="module")
def tokenizer(hf_smollm2_tokenizer):
    return hf_smollm2_tokenizer


def windowed(tokenizer, prompt, skip):
    return WindowDetokenizer(tokenizer, prompt, skip)


@pytest.mark.parametrize("make", [new_detokenizer, windowed], ids=["stream", "window"])
@pytest.mark.parametrize("skip_special_tokens", [True, False])
@pytest.mark.parametrize("chunk", [1, 3])
def test_incremental_text_is_the_full_decode(tokenizer, make, skip_special_tokens, chunk):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    prompt, output = ids[:7], ids[7:]
    detokenizer = make(tokenizer, prompt, skip_special_tokens)
    deltas = [detokenizer.add(output[i:i + chunk]) for i in range(0, len(output), chunk)]
    expected = tokenizer.decode(output, skip_special_tokens=skip_special_tokens)
    assert detokenizer.text == "".join(deltas) == expected
    assert not any("\ufffd" in delta for delta in deltas)


@pytest.mark.parametrize("make", [new_detokenizer, windowed], ids=["stream", "window"])
def test_a_character_split_over_tokens_waits_for_its_last_byte(tokenizer, make):
    ids = tokenizer.encode("ok 🚀", add_special_tokens=False)
    prompt, first = ids[:1], ids[1:]
    assert len(first) > 2, "the emoji should take several byte tokens"
    detokenizer = make(tokenizer, prompt, True)
    deltas = [detokenizer.add([token]) for token in first]
    assert deltas[-2] == "" and deltas[-1].endswith("🚀") and "".join(deltas) == " 🚀"


def test_the_stream_is_used_where_it_decodes_as_decode_does(tokenizer):
    assert isinstance(new_detokenizer(tokenizer, [1, 2], True), StreamDetokenizer)
    cleaning = copy.copy(tokenizer)
    cleaning.clean_up_tokenization_spaces = True  # a cleanup the Rust stream does not do
    assert isinstance(new_detokenizer(cleaning, [1, 2], True), WindowDetokenizer)
