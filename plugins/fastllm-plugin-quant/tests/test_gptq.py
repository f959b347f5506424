"""GPTQ against round-to-nearest on the activations it calibrates on, and its layer-by-layer replay.

The layer test uses correlated activations with a few loud input channels (as real ones have):
GPTQ must lower the output error ``|X (W - W_q)^T|`` well below that of the searched
round-to-nearest scales (``quantize_int4``) in the same format.
"""

from __future__ import annotations

import pytest
import torch

from fastllm import SamplingParams
from fastllm.engine.in_process import engine_model

from fastllm_quant.gptq import gptq_quantize, inverse_hessian_factor
from fastllm_quant.int4 import quantize_int4
from fastllm_quant.sequential import capture_inputs, decoder_layers, replay

from quant_helpers import random_float_weights, tiny_llm, tiny_prompts, write_checkpoint


def dequantize(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group: int) -> torch.Tensor:
    return ((codes.float().unflatten(1, (-1, group)) - zeros[..., None]) * scales[..., None]).flatten(1)


def activations(tokens: int, k: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    mixing = torch.randn(k, k, generator=gen) / k ** 0.5
    channel_scale = torch.exp(torch.randn(k, generator=gen))
    return torch.randn(tokens, k, generator=gen) @ mixing * channel_scale


@pytest.mark.parametrize("group", [32, 128])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_beats_round_to_nearest_on_calibration_outputs(group, act_order):
    x = activations(2048, 256)
    weight = torch.randn(192, 256, generator=torch.Generator().manual_seed(1)) * 0.02
    codes, scales, zeros = gptq_quantize(weight, 2 * x.t() @ x / len(x), group, act_order)
    assert codes.dtype == torch.uint8 and int(codes.max()) <= 15
    assert scales.shape == zeros.shape == (192, 256 // group)

    def output_error(dequantized: torch.Tensor) -> float:
        return float((x @ (weight - dequantized).t()).pow(2).sum())

    rtn = output_error(dequantize(*quantize_int4(weight, group), group))
    assert output_error(dequantize(codes, scales, zeros, group)) < (0.4 if act_order else 0.7) * rtn


def test_inverse_hessian_factor():
    x = activations(512, 64)
    hessian = 2 * x.t() @ x / len(x)
    hessian[5], hessian[:, 5] = 0, 0  # a dead input channel
    u = inverse_hessian_factor(hessian)
    damped = hessian.clone()
    damped[5, 5] = 1
    damped.diagonal().add_(0.01 * damped.diagonal().mean())
    assert torch.equal(u, u.triu())
    assert torch.allclose(u.t() @ u, torch.linalg.inv(damped.double()).float(), rtol=1e-3, atol=1e-5)


def test_replayed_layers_reproduce_the_engine(tmp_path):
    """A decoder layer replayed outside the engine on the captured inputs of the one before it
    gives what the engine fed the next layer (prompts long enough to be prefilled in chunks)."""
    llm = tiny_llm(write_checkpoint(str(tmp_path / "float"), random_float_weights()),
                   max_num_batched_tokens=32)
    layers = decoder_layers(engine_model(llm))

    def calibrate() -> None:
        llm.generate([{"prompt_token_ids": ids} for ids in tiny_prompts(seed=5)], SamplingParams(max_tokens=1),
                     use_tqdm=False)

    first = []  # both layers' inputs from the same pass (a second pass would hit the prefix cache)
    second = capture_inputs(layers[1], lambda: first.extend(capture_inputs(layers[0], calibrate)))
    assert len(first) == len(second) >= sum(map(len, tiny_prompts(seed=5))) / 32
    with torch.no_grad():
        replayed = [replay(layers[0], step) for step in first]
    for got, expected in zip(replayed, second):
        for a, b in zip(got.args, expected.args):
            assert torch.allclose(a, b, atol=1e-5)
