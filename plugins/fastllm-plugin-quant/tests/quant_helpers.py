"""Shared helpers: perplexity through the public API, and tiny random Llama checkpoints on disk."""

from __future__ import annotations

import json
import math
import os
from typing import Any

import torch
from safetensors.torch import save_file

from fastllm import LLM, SamplingParams

DATA = os.path.join(os.path.dirname(__file__), "data")
# CI scores 4 chunks of 1024 tokens; FASTLLM_PPL_CHUNKS=20 scores 20,480 positions of opticks.txt
# (the figures in benchmarks/RESULTS.md): the bounds in test_quant_quality.py hold for both.
CHUNK, NUM_CHUNKS = 1024, int(os.environ.get("FASTLLM_PPL_CHUNKS", "4"))
SMOLLM2_ARGS = dict(max_model_len=CHUNK + 1, num_gpu_blocks_override=NUM_CHUNKS * (CHUNK // 64 + 1),
                    max_num_seqs=NUM_CHUNKS, max_num_batched_tokens=4096)

TINY_LLAMA = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=256, hidden_size=128,
    intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
    bos_token_id=1, eos_token_id=2, torch_dtype="float32",
)
LINEAR_SHAPES = {  # HF name -> (out, in) for TINY_LLAMA
    "self_attn.q_proj": (128, 128), "self_attn.k_proj": (64, 128), "self_attn.v_proj": (64, 128),
    "self_attn.o_proj": (128, 128), "mlp.gate_proj": (256, 128), "mlp.up_proj": (256, 128),
    "mlp.down_proj": (128, 256),
}


def prompt_chunks(llm: LLM) -> list[list[int]]:
    with open(os.path.join(DATA, "opticks.txt")) as f:
        ids = llm.tokenizer(f.read(), add_special_tokens=False)["input_ids"]
    assert len(ids) >= CHUNK * NUM_CHUNKS
    return [ids[i * CHUNK:(i + 1) * CHUNK] for i in range(NUM_CHUNKS)]


def chunk_nlls(llm: LLM, num_chunks: int = NUM_CHUNKS) -> list[float]:
    """Summed negative log-likelihood of each prompt's tokens after its first, one batched generate."""
    prompts = prompt_chunks(llm)[:num_chunks]
    outputs = llm.generate(prompts, SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)
    sums = []
    for prompt, output in zip(prompts, outputs):
        assert output.prompt_logprobs[0] is None and len(output.prompt_logprobs) == len(prompt)
        sums.append(-sum(entry[token] for token, entry in zip(prompt[1:], output.prompt_logprobs[1:])))
    return sums


def perplexity(nlls: list[float]) -> float:
    return math.exp(sum(nlls) / (len(nlls) * (CHUNK - 1)))


def random_float_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    weights = {"model.embed_tokens.weight": torch.randn(256, 128, generator=gen),
               "lm_head.weight": torch.randn(256, 128, generator=gen) * 0.1,
               "model.norm.weight": torch.ones(128)}
    for layer in range(TINY_LLAMA["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        weights[prefix + "input_layernorm.weight"] = torch.ones(128)
        weights[prefix + "post_attention_layernorm.weight"] = torch.ones(128)
        for name, shape in LINEAR_SHAPES.items():
            weights[f"{prefix}{name}.weight"] = torch.randn(*shape, generator=gen) / math.sqrt(shape[1])
    return weights


def write_checkpoint(folder: str, tensors: dict[str, torch.Tensor],
                     quantization_config: dict[str, Any] | None = None) -> str:
    os.makedirs(folder, exist_ok=True)
    config = dict(TINY_LLAMA)
    if quantization_config is not None:
        config["quantization_config"] = quantization_config
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(folder, "model.safetensors"))
    return folder


def tiny_llm(folder: str, **kwargs: Any) -> LLM:
    return LLM(folder, max_model_len=256, num_gpu_blocks_override=16, block_size=16, **kwargs)


def tiny_prompts(seed: int = 1) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 256, (n,), generator=gen).tolist() for n in (37, 64, 90)]


def prompt_logprobs(llm: LLM, prompts: list[list[int]]) -> torch.Tensor:
    """Every prompt position's logprob of the actual next token, concatenated."""
    outputs = llm.generate(prompts, SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)
    return torch.tensor([entry[token] for prompt, output in zip(prompts, outputs)
                         for token, entry in zip(prompt[1:], output.prompt_logprobs[1:])])
