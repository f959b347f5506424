"""``fastllm quantize``: the seed's offline quantization tool (this plugin's ``cli_commands`` entry).

Loads a model (HF safetensors directory or GGUF file) through the engine, quantizes its
linear layers with any registered method (calibrating first for methods that observe
activations) and writes a directory that ``LLM(model=OUT)`` loads as is. The seed's
single-dash spellings (``-quant_type``, ``-sq``, ``-token``) are accepted too.
"""

from __future__ import annotations

import argparse
import logging

import torch

from fastllm import registry
from fastllm.engine.in_process import engine_runner
from fastllm.llm import LLM
from fastllm.quantization.export import save_quantized
from fastllm.quantization.loading import checkpoint_quantization
from fastllm.sampling_params import SamplingParams

from fastllm_quant.calibration import calibration_prompts

logger = logging.getLogger("fastllm")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
CALIBRATION_CHUNK = 512


def run(args: argparse.Namespace) -> int:
    factory = registry.get("quantizers", args.quant_type)
    options = {"alpha": args.sq, "group_size": args.group_size, "act_order": args.act_order or None}
    quantizer = factory(None, **{key: value for key, value in options.items() if value is not None})
    llm = LLM(model=args.input, max_model_len=CALIBRATION_CHUNK, num_gpu_blocks_override=CALIBRATION_CHUNK // 64 + 1,
              max_num_seqs=1)
    engine = llm.engine
    if checkpoint_quantization(engine.hf_config) is not None:
        raise SystemExit(f"{args.input} is already quantized; quantize its float original instead")

    def calibrate_on_text() -> None:
        prompts = calibration_prompts(engine.tokenizer, args.tokenids_path, CALIBRATION_CHUNK - 1)
        llm.generate([{"prompt_token_ids": ids} for ids in prompts], SamplingParams(max_tokens=1), use_tqdm=False)

    runner = engine_runner(llm)
    # Online methods without --tokenids-path see what loading with quantization=NAME sees: the same codes.
    online = quantizer.online_calibration(runner.model, runner.run_prompts) if args.tokenids_path is None else None
    quantizer.quantize_model(runner.model, online or calibrate_on_text)
    save_quantized(runner.model, engine.hf_config, engine.tokenizer, quantizer, args.output, DTYPES[args.dtype])
    logger.info("wrote %s (%s, non-quantized tensors in %s)", args.output, quantizer.name, args.dtype)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("quantize", help="quantize a model offline into a loadable directory")
    parser.add_argument("-i", "--input", required=True, help="HF safetensors directory or .gguf file")
    parser.add_argument("-o", "--output", required=True, help="directory to write")
    parser.add_argument("--quant-type", "-quant_type", "--quant_type", dest="quant_type", required=True,
                        help="a registered quantizer: weight_only_int8, fp8, nf4, weight_only_int4, gptq, smooth_quant")
    parser.add_argument("-t", "--dtype", choices=sorted(DTYPES), default="bf16",
                        help="storage dtype of the tensors that stay unquantized (and of the scales)")
    parser.add_argument("-sq", "--smooth-alpha", dest="sq", type=float, default=None,
                        help="SmoothQuant migration strength in [0, 1] (default 0.8)")
    parser.add_argument("--group-size", dest="group_size", type=int, default=None,
                        help="weight_only_int4 / gptq: inputs per scale, a power of two (default 64 / 128)")
    parser.add_argument("--act-order", dest="act_order", action="store_true",
                        help="gptq: quantize the most active input channels first")
    parser.add_argument("--tokenids-path", "--tokenids_path", "-token", dest="tokenids_path", default=None,
                        help="calibration token ids, whitespace separated (default: a built-in text; "
                             "random token ids, as at load, for weight_only_int4 and nf4)")
    parser.set_defaults(func=run)
