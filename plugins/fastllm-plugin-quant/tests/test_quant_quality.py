"""Online quantization of SmolLM2-135M: perplexity against the unquantized model, answers, bytes."""

from __future__ import annotations

import logging
import re

import pytest

from fastllm import LLM, SamplingParams
from fastllm.entrypoints.cli.main import main
from fastllm.engine.in_process import engine_model
from fastllm.quantization import QuantizedLinear

from quant_helpers import SMOLLM2_ARGS, chunk_nlls, perplexity

# method -> (allowed relative perplexity increase, weight bits). int8 (+1%) and fp8 (+2%) are
# the targets; the 4-bit bounds sit just above today's figures (benchmarks/RESULTS.md)
# so that a regression fails. This 135M model's float weights are themselves dequantized Q4_1
# (blocks of 32), so a second 4-bit rounding costs more than on a float checkpoint; int4 with
# groups of 32 lands on the source grid and loses nothing, which says nothing about float
# checkpoints.
METHODS = {
    "weight_only_int8": (0.01, 8),
    "fp8": (0.02, 8),
    "nf4": (0.08, 4),
    "weight_only_int4": (0.10, 4),
}
# GPTQ (fastllm quantize --quant-type gptq --group-size 64 --act-order, built-in calibration
# text) meets the +10% target in online int4's format (benchmarks/RESULTS.md).
GPTQ_ALLOWED = 0.10
QUESTIONS = {"The capital of France is": "Paris", "1, 2, 3, 4,": "5"}


def linear_bytes_ratio(llm: LLM) -> float:
    """Bytes of the quantized linear layers over the same weights in 16 bits."""
    modules = [m for m in engine_model(llm).modules() if isinstance(m, QuantizedLinear)]
    assert len(modules) == 4 * 30  # qkv, o, gate_up, down in every layer
    quantized = sum(p.numel() * p.element_size() for m in modules for p in m.parameters())
    return quantized / sum(2 * m.input_size * m.output_size for m in modules)


@pytest.mark.parametrize("method", list(METHODS))
def test_online_quantization(method, smollm2_path, baseline_nlls, caplog):
    allowed, bits = METHODS[method]
    with caplog.at_level(logging.INFO, logger="fastllm"):
        llm = LLM(smollm2_path, quantization=method, **SMOLLM2_ARGS)
    logged = re.search(r"weight bytes before quantization: (\d+) .* after (\S+): (\d+)", caplog.text)
    assert logged and logged.group(2) == method and int(logged.group(3)) < int(logged.group(1))
    assert_quality(llm, method, baseline_nlls, allowed, bits)


@pytest.fixture(scope="session")
def gptq_dir(smollm2_path, tmp_path_factory) -> str:
    """SmolLM2 through `fastllm quantize --quant-type gptq` (built-in calibration text), on disk."""
    out = str(tmp_path_factory.mktemp("gptq") / "smollm2-gptq")
    assert main(["quantize", "-i", smollm2_path, "-o", out, "--quant-type", "gptq", "--group-size", "64",
                 "--act-order", "-t", "fp16"]) == 0
    return out


def test_gptq_checkpoint(gptq_dir, baseline_nlls):
    """Calibrated 4-bit meets the target that round-to-nearest misses (see GPTQ_ALLOWED)."""
    assert_quality(LLM(gptq_dir, **SMOLLM2_ARGS), "gptq", baseline_nlls, GPTQ_ALLOWED, 4)


def assert_quality(llm: LLM, method: str, baseline_nlls: list[float], allowed: float, bits: int) -> None:
    """Linear-layer bytes, perplexity within ``allowed`` of the unquantized model, and answers."""
    # 1/2 (8-bit) or 1/4 (4-bit) of 16-bit weights, plus scales kept in the CPU's float32
    ratio = linear_bytes_ratio(llm)
    assert bits / 16 < ratio < bits / 16 * (1.05 if bits == 8 else 1.3)

    ppl, baseline = perplexity(chunk_nlls(llm)), perplexity(baseline_nlls)
    print(f"{method}: perplexity {ppl:.3f} vs {baseline:.3f} (+{ppl / baseline - 1:.2%}), "
          f"linear bytes {ratio:.3f} of 16-bit")
    assert ppl <= baseline * (1 + allowed)

    outputs = llm.generate(list(QUESTIONS), SamplingParams(max_tokens=8, temperature=0), use_tqdm=False)
    for output, expected in zip(outputs, QUESTIONS.values()):
        assert expected in output.outputs.text, (output.prompt, output.outputs.text)


def test_fp8_kv_cache(smollm2_path, baseline_nlls):
    """The torch backend stores and reads float8 caches; unscaled e4m3 costs little accuracy.

    Four chunks (4,092 scored tokens) keep the suite short; the comparison uses the same chunks.
    """
    ppl = perplexity(chunk_nlls(LLM(smollm2_path, kv_cache_dtype="fp8", **SMOLLM2_ARGS), 4))
    baseline = perplexity(baseline_nlls[:4])
    print(f"fp8 KV cache: perplexity {ppl:.3f} vs {baseline:.3f} (+{ppl / baseline - 1:.2%})")
    assert ppl <= baseline * 1.03
