"""Shared fixtures: the embedded SmolLM2, HF reference outputs, and tiny random models."""

from __future__ import annotations

import contextlib
import functools
import json
import os
from typing import Iterator

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton kernels run on CPU tensors (set before they load)

from fastllm.model_loader.resolve import embedded_model_path


def needs_ranks(world: int) -> pytest.MarkDecorator:
    """For a test whose engine runs ``world`` ranks: over gloo on a machine without CUDA, one GPU a
    rank on one with it, so a CUDA machine with fewer GPUs skips the test (the engine refuses)."""
    visible = torch.cuda.device_count()
    return pytest.mark.skipif(0 < visible < world, reason=f"{world} ranks on CUDA need {world} GPUs, {visible} visible")


def logprob_tolerance(**on_cuda: float) -> dict[str, float]:
    """``pytest.approx``'s tolerance between logprobs of two ways to the same tokens: 1e-4 on the CPU,
    where only the order of float32 sums differs; ``on_cuda`` where GEMMs also take other tiles."""
    return on_cuda if torch.cuda.is_available() else dict(abs=1e-4)


TINY_LLAMA = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=256, hidden_size=64,
    intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
    bos_token_id=1, eos_token_id=2,
)


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    return embedded_model_path()


@contextlib.contextmanager
def gguf_parsed_once() -> Iterator[None]:
    """transformers parses a GGUF header (seconds in Python) for the config, again for the weights
    and again for the tokenizer, and rebuilds gguf's tensor-name map for every module: within this
    block each is built once. Both are pure functions of their arguments, so what loads is the same."""
    import gguf

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", functools.lru_cache(maxsize=1)(gguf.GGUFReader))
        patch.setattr(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map))
        yield


@functools.lru_cache(maxsize=1)
def hf_gguf_tokenizer(path: str):
    """HF transformers' own conversion of a GGUF file's tokenizer (a function, not a fixture
    dependency, so that suites importing ``hf_smollm2`` alone keep working)."""
    from transformers import AutoTokenizer

    with gguf_parsed_once():
        return AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))


@pytest.fixture(scope="session")
def hf_smollm2_tokenizer(smollm2_path):
    return hf_gguf_tokenizer(smollm2_path)


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_path):
    """HF transformers' own model on the same GGUF weights: the reference for greedy output."""
    from transformers import AutoModelForCausalLM

    folder, name = os.path.dirname(smollm2_path), os.path.basename(smollm2_path)
    with gguf_parsed_once():
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    return model, hf_gguf_tokenizer(smollm2_path)


@pytest.fixture(scope="session")
def smollm2_llm(smollm2_path):
    """One engine for the tests that do not need special engine settings."""
    from fastllm import LLM

    return LLM(smollm2_path, max_model_len=1024, num_gpu_blocks_override=96, max_num_seqs=32)


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=2)
    return out[0, len(prompt_ids):].tolist()


@pytest.fixture
def tiny_llama_dir(tmp_path) -> str:
    """A config-only directory for a 2-layer random Llama (dummy weights, token-id prompts)."""
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    return str(tmp_path)
