"""Vision-language serving: offline request throughput and time to first token with one image
per request, against HF transformers' batched ``generate`` on the same model, and batch-1 decode.

  python benchmarks/multimodal_bench.py --phase fastllm --model qwen2.5-vl-7b --num-prompts 500
  python benchmarks/multimodal_bench.py --phase hf --model qwen2.5-vl-7b --num-prompts 32 --hf-batch 16
  python benchmarks/multimodal_bench.py --phase decode --model ernie-4.5-vl-28b-a3b

Each request: one distinct random ``--image-size`` square image and ``--question-len`` random
text tokens, ``--output-len`` tokens out (ignore_eos). Weights are dummy (``--load-format
dummy``) unless the model is a checkpoint directory. Each phase prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch

from fastllm import LLM, SamplingParams

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

PLACEHOLDERS = {  # the tokens around one image in a prompt
    "qwen": ("vision_start_token_id", "image_token_id", "vision_end_token_id"),
    "ernie": ("image_start_token_id", "image_token_id", "image_end_token_id"),
}


def prompts(config, num: int, question_len: int, image_size: int, seed: int = 0) -> list[dict]:
    family = "ernie" if "ernie" in config.model_type else "qwen"
    image = [getattr(config, name) for name in PLACEHOLDERS[family]]
    vocab = getattr(config, "text_config", config).vocab_size
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(num):
        question = rng.integers(100, min(vocab, 30000), question_len).tolist()
        pixels = rng.integers(0, 256, (image_size, image_size, 3), dtype=np.uint8)
        out.append({"prompt_token_ids": image + question, "multimodal_data": {"image": [pixels]}})
    return out


def engine(args) -> LLM:
    return LLM(args.model, load_format=args.load_format, dtype=args.dtype, max_model_len=args.max_model_len,
               max_num_seqs=args.max_num_seqs, enable_prefix_caching=False)


def measure(llm: LLM, args) -> dict:
    """Request throughput and TTFT (from when ``generate`` queued it) of ``--num-prompts`` requests."""
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True, temperature=0)
    batch = prompts(llm.engine.hf_config, args.num_prompts, args.question_len, args.image_size)
    start = time.perf_counter()
    outputs = llm.generate(batch, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    assert all(o.error_code == 200 for o in outputs), [o.error_msg for o in outputs if o.error_code != 200][:3]
    ttft = np.array([o.metrics.first_token_time - o.metrics.arrival_time for o in outputs])
    return {"requests": len(outputs), "seconds": round(elapsed, 2), "requests_per_s": round(len(outputs) / elapsed, 3),
            "output_tokens_per_s": round(sum(len(o.outputs.token_ids) for o in outputs) / elapsed, 1),
            "prompt_tokens": len(outputs[0].prompt_token_ids),
            "ttft_s": {p: round(float(np.percentile(ttft, p)), 3) for p in (50, 90, 99)}}


def run_fastllm(args) -> dict:
    llm = engine(args)
    warm = prompts(llm.engine.hf_config, 4, args.question_len, args.image_size, seed=1)
    llm.generate(warm, SamplingParams(max_tokens=args.output_len, ignore_eos=True), use_tqdm=False)
    return {"phase": "fastllm", **measure(llm, args)}


def run_hf(args) -> dict:
    """transformers' batched generate, ``--hf-batch`` requests at a time (all prompts have one
    length, so no padding); the same processor output fastllm's plugin makes."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    from fastllm import registry
    from fastllm.model_loader.dummy_loader import DummyLoader
    from fastllm.multimodal.media import load_image

    config = AutoConfig.from_pretrained(args.model) if os.path.isdir(args.model) else \
        DummyLoader().load_config(args.model)
    processor = registry.get("multimodal_processors", config.architectures[0])(config, None, args.model)
    dtype = getattr(torch, args.dtype)
    with torch.device(DEVICE):
        model = AutoModelForImageTextToText.from_config(config, dtype=dtype).eval()

    def generate(chunk: list[dict], new_tokens: int) -> None:
        processed = [processor.process(p["prompt_token_ids"], {"image": [load_image(p["multimodal_data"]["image"][0])]})
                     for p in chunk]
        ids = torch.tensor([p[0] for p in processed], device=DEVICE)
        items = [item for _, mm in processed for item in mm.items]
        kwargs = {"pixel_values": torch.cat([i.pixel_values for i in items]).to(DEVICE, dtype),
                  "image_grid_thw": torch.tensor([i.grid_thw for i in items], device=DEVICE),
                  "mm_token_type_ids": (ids == config.image_token_id).int()}
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=0, **kwargs)
        assert out.shape[1] == ids.shape[1] + new_tokens

    generate(prompts(config, 2, args.question_len, args.image_size, seed=1), 2)  # warm-up
    batch = prompts(config, args.num_prompts, args.question_len, args.image_size)
    synchronize()
    start = time.perf_counter()  # like fastllm's figure, this includes the image processor
    for first in range(0, len(batch), args.hf_batch):
        generate(batch[first:first + args.hf_batch], args.output_len)
    synchronize()
    elapsed, done = time.perf_counter() - start, len(batch)
    return {"phase": "hf", "requests": done, "batch": args.hf_batch, "seconds": round(elapsed, 2),
            "requests_per_s": round(done / elapsed, 3),
            "output_tokens_per_s": round(done * args.output_len / elapsed, 1)}


def synchronize() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def run_decode(args) -> dict:
    """Batch-1 decode tokens/s (a long generation minus a one-token one), then throughput."""
    llm = engine(args)
    one = prompts(llm.engine.hf_config, 1, args.question_len, args.image_size, seed=2)

    def timed(n: int) -> float:
        start = time.perf_counter()
        llm.generate(one, SamplingParams(max_tokens=n, ignore_eos=True, temperature=0), use_tqdm=False)
        return time.perf_counter() - start

    timed(8)
    decode = (args.decode_len - 1) / (timed(args.decode_len) - timed(1))
    return {"phase": "decode", "batch1_decode_tokens_per_s": round(decode, 1), **measure(llm, args)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phase", choices=["fastllm", "hf", "decode"], required=True)
    parser.add_argument("--model", default="qwen2.5-vl-7b")
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--num-prompts", type=int, default=500)
    parser.add_argument("--image-size", type=int, default=1024)
    parser.add_argument("--question-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--decode-len", type=int, default=256)
    parser.add_argument("--hf-batch", type=int, default=16)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    args = parser.parse_args()
    run = {"fastllm": run_fastllm, "hf": run_hf, "decode": run_decode}[args.phase]
    print(json.dumps({"model": args.model, "image_size": args.image_size, **run(args)}), flush=True)


if __name__ == "__main__":
    main()
