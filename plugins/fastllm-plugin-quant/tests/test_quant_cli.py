"""``fastllm quantize`` writes directories that load with no flag and compute what online quantization does."""

from __future__ import annotations

import json
import os

import pytest
import torch

from fastllm import LLM, SamplingParams
from fastllm.entrypoints.cli.main import main
from fastllm.engine.in_process import engine_model
from fastllm.quantization import QuantizedLinear

from fastllm_quant.int4 import Int4Linear

from quant_helpers import prompt_logprobs, random_float_weights, tiny_llm, tiny_prompts, write_checkpoint

METHODS = ["weight_only_int8", "fp8", "nf4", "weight_only_int4", "smooth_quant"]


@pytest.fixture
def float_dir(tmp_path) -> str:
    return write_checkpoint(str(tmp_path / "float"), random_float_weights())


@pytest.fixture
def tokenids_path(tmp_path) -> str:
    path = tmp_path / "calibration.txt"
    path.write_text("\n".join(" ".join(map(str, ids)) for ids in tiny_prompts(seed=5)))
    return str(path)


@pytest.mark.parametrize("method", METHODS)
def test_round_trip(tmp_path, float_dir, tokenids_path, method):
    out = str(tmp_path / "out")
    argv = ["quantize", "-i", float_dir, "-o", out, "-quant_type", method, "-t", "fp16"]
    if method == "smooth_quant":  # the others calibrate (int4, nf4) on random tokens, as online
        argv += ["-sq", "0.5", "--tokenids-path", tokenids_path]
    assert main(argv) == 0
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    assert config["quantization_config"]["quant_method"] == method and config["torch_dtype"] == "float16"

    loaded = tiny_llm(out)
    modules = {n: m for n, m in engine_model(loaded).named_modules() if isinstance(m, QuantizedLinear)}
    assert len(modules) == 8
    prompts = tiny_prompts()
    reference = prompt_logprobs(tiny_llm(float_dir), prompts)
    saved_error = (prompt_logprobs(loaded, prompts) - reference).abs().mean()
    if method == "smooth_quant":  # calibrated offline only: compare with the float model
        assert saved_error < 0.05
        return
    online = tiny_llm(float_dir, quantization=method)
    for name, module in engine_model(online).named_modules():  # the same codes, bit for bit
        if isinstance(module, QuantizedLinear):
            for param_name, param in module.named_parameters():
                if not param.dtype.is_floating_point or param.dtype.itemsize == 1:
                    assert torch.equal(param, modules[name].get_parameter(param_name)), (name, param_name)
    online_error = (prompt_logprobs(online, prompts) - reference).abs().mean()
    assert saved_error <= 1.2 * online_error + 0.005  # fp16 storage of scales and norms aside


@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_round_trip(tmp_path, float_dir, act_order):
    """GPTQ's codes saved in weight_only_int4's format: they load with no flag and track the
    float model more closely than round-to-nearest int4 with the same groups and calibration.

    Calibration takes 2,048 random tokens: Hessians of 256 inputs need many more tokens than
    that to generalise to other prompts. The random model's activations are nearly isotropic,
    which leaves GPTQ little to exploit beyond the loudness both fits weigh by; test_gptq.py
    checks the gain on correlated activations.
    """
    calibration = tmp_path / "calibration.txt"
    ids = torch.randint(3, 256, (2048,), generator=torch.Generator().manual_seed(5))
    calibration.write_text(" ".join(map(str, ids.tolist())))
    out = str(tmp_path / "gptq")
    argv = ["quantize", "-i", float_dir, "-o", out, "--quant-type", "gptq", "--tokenids-path", str(calibration)]
    assert main(argv + (["--act-order"] if act_order else [])) == 0
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)["quantization_config"]
    assert config == {"quant_method": "weight_only_int4", "bits": 4, "group_size": 128, "calibration": "gptq",
                      "act_order": act_order}

    loaded = tiny_llm(out)
    modules = [m for m in engine_model(loaded).modules() if isinstance(m, QuantizedLinear)]
    assert len(modules) == 8 and all(isinstance(m, Int4Linear) and m.input_perm is None for m in modules)
    prompts = tiny_prompts()
    reference = prompt_logprobs(tiny_llm(float_dir), prompts)
    gptq_error = (prompt_logprobs(loaded, prompts) - reference).abs().mean()
    rtn_dir = str(tmp_path / "rtn")  # round-to-nearest, fitted on the same calibration, groups of 128
    assert main(["quantize", "-i", float_dir, "-o", rtn_dir, "--quant-type", "weight_only_int4",
                 "--group-size", "128", "--tokenids-path", str(calibration)]) == 0
    rtn_error = (prompt_logprobs(tiny_llm(rtn_dir), prompts) - reference).abs().mean()
    assert gptq_error < rtn_error


def test_gguf_input(tmp_path):
    """The embedded GGUF SmolLM2 -> an int8 directory with its tokenizer, loadable as is."""
    from fastllm.model_loader.resolve import embedded_model_path

    out = str(tmp_path / "smollm2-int8")
    assert main(["quantize", "-i", embedded_model_path(), "-o", out, "--quant-type", "ifq"]) == 0
    assert os.path.exists(os.path.join(out, "tokenizer.json"))
    llm = LLM(out, max_model_len=256, num_gpu_blocks_override=8)
    assert llm.engine.hf_config.quantization_config["quant_method"] == "weight_only_int8"
    text = llm.generate("The capital of France is", SamplingParams(max_tokens=6, temperature=0),
                        use_tqdm=False)[0].outputs.text
    assert "Paris" in text


def test_unknown_quant_type(float_dir, tmp_path):
    with pytest.raises(ValueError, match="unknown quantizer 'int2'"):
        main(["quantize", "-i", float_dir, "-o", str(tmp_path / "x"), "--quant-type", "int2"])


def test_quantized_input_is_refused(tmp_path, float_dir):
    out = str(tmp_path / "int8")
    main(["quantize", "-i", float_dir, "-o", out, "--quant-type", "weight_only_int8"])
    with pytest.raises(SystemExit, match="already quantized"):
        main(["quantize", "-i", out, "-o", str(tmp_path / "again"), "--quant-type", "fp8"])
