"""The tiny random Llama of tests/conftest.py, given a word-level tokenizer so ShareGPT prompts load."""

from __future__ import annotations

import json
import os

import pytest

SHAREGPT = os.path.join(os.path.dirname(__file__), "sharegpt_tiny.json")
# The fixture's usable conversations ("hi"/"hello" is too short, the last has no answer): words per turn.
SHAREGPT_PROMPT_TOKENS = 7 + 7
SHAREGPT_ANSWER_TOKENS = 10 + 9


@pytest.fixture
def tiny_dir_with_tokenizer(tiny_llama_dir) -> str:
    """tiny_llama_dir plus a whitespace word-level tokenizer over the fixture's words (ids < 256)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    with open(SHAREGPT) as f:
        words = {w for item in json.load(f) for turn in item["conversations"] for w in turn["value"].split()}
    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(sorted(words))}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", bos_token="<s>",
                                        eos_token="</s>")
    tokenizer.save_pretrained(tiny_llama_dir)
    return tiny_llama_dir


def engine_flags(model_dir: str) -> list[str]:
    """A small CPU engine over dummy weights."""
    return ["--model", model_dir, "--load-format", "dummy", "--dtype", "float32", "--max-model-len", "256",
            "--block-size", "16", "--num-gpu-blocks-override", "64", "--max-num-seqs", "8"]
