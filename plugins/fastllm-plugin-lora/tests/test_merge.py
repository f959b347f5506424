"""Merging: ``fastllm merge-lora`` writes PEFT's merge_and_unload weights, and the merged model,
``merge_lora=`` at load and the adapter served unmerged all decode like PEFT."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

from fastllm import LLM, LoRARequest, SamplingParams, registry
from fastllm.entrypoints.cli.main import main

from lora_helpers import peft_greedy, write_adapter

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
            bos_token_id=1, eos_token_id=2)
PROMPT = [1, 17, 99, 4, 200, 31, 8]
ENGINE = dict(max_model_len=128, num_gpu_blocks_override=16, block_size=16)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY)).eval()
    base = str(tmp_path_factory.mktemp("base"))
    model.save_pretrained(base)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    adapter = write_adapter(str(tmp_path_factory.mktemp("adapter")), model.config, 4, targets, seed=3, strength=3.0)
    return model, base, adapter


def _greedy(llm: LLM, **kwargs) -> list[int]:
    return llm.generate([PROMPT], SamplingParams(max_tokens=8, temperature=0), use_tqdm=False,
                        **kwargs)[0].completions[0].token_ids


def test_merge_lora_matches_peft(tiny, tmp_path):
    from peft import PeftModel

    model, base, adapter = tiny
    peft = PeftModel.from_pretrained(copy.deepcopy(model), adapter, adapter_name="a").eval()
    expected, unmerged = peft_greedy(peft, "a", PROMPT, 8), peft_greedy(peft, None, PROMPT, 8)
    reference = peft.merge_and_unload().state_dict()
    out = str(tmp_path / "merged")

    assert main(["merge-lora", "-i", base, "-a", adapter, "-o", out]) == 0

    merged = load_file(os.path.join(out, "model.safetensors"))
    for name, tensor in merged.items():
        assert torch.allclose(tensor, reference[name], atol=1e-6), name
    assert _greedy(LLM(out, **ENGINE)) == expected
    assert _greedy(LLM(base, merge_lora=adapter, **ENGINE)) == expected
    lora = LLM(base, enable_lora=True, max_lora_rank=8, **ENGINE)
    assert _greedy(lora, lora_request=LoRARequest("a", 1, adapter)) == expected
    assert _greedy(lora) == unmerged != expected


def test_merge_lora_refuses_a_bad_adapter(tiny, tmp_path):
    _, base, _ = tiny
    with pytest.raises(SystemExit, match="not found"):
        main(["merge-lora", "-i", base, "-a", str(tmp_path / "nowhere"), "-o", str(tmp_path / "out")])


@pytest.mark.parametrize("method", ["weight_only_int8", "fp8", "nf4"])
def test_lora_on_a_quantized_base(tiny, method):
    """The adapter wraps the quantized layer: base requests decode as the quantized model alone,
    adapter requests differ from them."""
    _, base, adapter = tiny
    if method not in registry.names("quantizers"):
        pytest.skip(f"no {method} quantizer installed")
    plain = _greedy(LLM(base, quantization=method, **ENGINE))
    lora = LLM(base, quantization=method, enable_lora=True, max_lora_rank=8, **ENGINE)
    assert _greedy(lora) == plain
    assert _greedy(lora, lora_request=LoRARequest("a", 1, adapter)) != plain
