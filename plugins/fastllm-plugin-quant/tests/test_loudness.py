"""Input loudness: the runner's random-token calibration at load, and what the 4-bit fits get from it."""

from __future__ import annotations

import pytest
import torch

from fastllm.worker.model_runner import ModelRunner
from fastllm.engine.in_process import engine_runner
from fastllm.layers.linear import LinearBase
from fastllm_quant.int4 import WeightOnlyInt4Quantizer
from fastllm_quant.loudness import input_loudness
from fastllm_quant.nf4 import Nf4Quantizer

from quant_helpers import random_float_weights, tiny_llm, write_checkpoint

LOUD_CHANNEL, GAIN = 5, 10.0


@pytest.fixture(scope="module")
def loud_dir(tmp_path_factory) -> str:
    """The tiny float Llama with one channel of layer 0's attention norm 10x the others."""
    weights = random_float_weights()
    weights["model.layers.0.input_layernorm.weight"][LOUD_CHANNEL] = GAIN
    return write_checkpoint(str(tmp_path_factory.mktemp("loud")), weights)


def test_random_tokens_find_the_loud_channel(loud_dir):
    """Every linear layer is reached; the 10x norm gain shows as ~100x the mean square; the
    serving cache is untouched by a calibration after start-up."""
    runner = engine_runner(tiny_llm(loud_dir))
    caches = runner.kv_caches
    loudness = input_loudness(runner.model, Nf4Quantizer(None).online_calibration(runner.model, runner.run_prompts))
    assert runner.kv_caches is caches
    linear = {name: m for name, m in runner.model.named_modules() if isinstance(m, LinearBase)}
    assert set(loudness) == set(linear) and len(linear) == 8
    for name, values in loudness.items():
        assert values.shape == (linear[name].input_size,) and values.mean().item() == pytest.approx(1.0, rel=1e-4)
    qkv = loudness["model.layers.0.self_attn.qkv_proj"]
    others = torch.cat([qkv[:LOUD_CHANNEL], qkv[LOUD_CHANNEL + 1:]])
    assert qkv[LOUD_CHANNEL] > 0.5 * GAIN ** 2 * others.median()


@pytest.mark.parametrize("quantizer", [WeightOnlyInt4Quantizer, Nf4Quantizer])
def test_online_4bit_fits_see_the_loudness(loud_dir, quantizer, monkeypatch):
    """Loading with quantization=NAME hands each layer the loudness of its own inputs."""
    seen: list[tuple[LinearBase, torch.Tensor]] = []
    quantize_layer = quantizer.quantize_layer

    def spy(self, layer, loudness=None):
        seen.append((layer, loudness))
        return quantize_layer(self, layer, loudness)

    monkeypatch.setattr(quantizer, "quantize_layer", spy)
    tiny_llm(loud_dir, quantization=quantizer.name)
    assert len(seen) == 8
    assert all(loudness is not None and loudness.shape == (layer.input_size,) for layer, loudness in seen)
    first_qkv = seen[0][1]  # layers are replaced in module order: layer 0's qkv_proj first
    assert int(first_qkv.argmax()) == LOUD_CHANNEL


def test_methods_that_ignore_inputs_skip_the_calibration(loud_dir, monkeypatch):
    def refuse(self, prompts):
        raise AssertionError("calibrated a method that does not observe its inputs")

    monkeypatch.setattr(ModelRunner, "run_prompts", refuse)
    tiny_llm(loud_dir, quantization="weight_only_int8")
