"""Multi-LoRA serving cost: output throughput of a batch spread over adapters and the base model,
against the base model alone, and batch-1 decode with an adapter against the base model.

  python benchmarks/lora_bench.py --phase base --model llama-3-8b --num-prompts 1000
  python benchmarks/lora_bench.py --phase lora --model llama-3-8b --num-prompts 1000 --adapters 8 --rank 16
  python benchmarks/lora_bench.py --phase graphs --model smollm2-135m   # CUDA graphs give eager's tokens

Each phase is its own process (a whole GPU each); compare their numbers from the same machine.

Adapters are random PEFT-format directories on all seven projections; weights are dummy.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time

import torch
from safetensors.torch import save_file

from fastllm import LLM, LoRARequest, SamplingParams

PROJECTIONS = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
               "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def write_adapter(path: str, config, rank: int, seed: int, strength: float = 0.01) -> str:
    hidden, inter = config.hidden_size, config.intermediate_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    shapes = {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (q, hidden),
              "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden)}
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config.num_hidden_layers):
        for name, (inputs, outputs) in shapes.items():
            prefix = f"base_model.model.model.layers.{layer}.{PROJECTIONS[name]}.{name}"
            tensors[f"{prefix}.lora_A.weight"] = (torch.randn(rank, inputs, generator=generator) / inputs ** 0.5).bfloat16()
            tensors[f"{prefix}.lora_B.weight"] = (torch.randn(outputs, rank, generator=generator) * strength).bfloat16()
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(shapes),
                   "bias": "none"}, f)
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    return path


def throughput(llm: LLM, prompts: list[list[int]], output_len: int, lora) -> float:
    params = SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False, lora_request=lora)
    elapsed = time.perf_counter() - start
    return sum(len(o.completions[0].token_ids) for o in outputs) / elapsed


def decode_rate(llm: LLM, prompt: list[int], output_len: int, lora) -> float:
    """Batch-1 decode tokens/s: a long generation minus a one-token one (the prefill)."""
    def timed(tokens: int) -> float:
        start = time.perf_counter()
        llm.generate([prompt], SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0), use_tqdm=False,
                     lora_request=lora)
        return time.perf_counter() - start
    timed(8)
    return (output_len - 1) / (timed(output_len) - timed(1))


def graphs_match_eager(args: argparse.Namespace, prompts: list[list[int]]) -> dict:
    """float32 greedy tokens of a batch mixing adapters and the base model, decoded through the
    CUDA graphs and eagerly; how many steps replayed a graph with adapter tokens in it."""
    tokens, replays = {}, 0
    for eager in (True, False):
        llm = LLM(args.model, load_format="dummy", dtype="float32", max_model_len=512, enforce_eager=eager,
                  num_gpu_blocks_override=512, max_num_seqs=16, enable_lora=True, max_loras=4, max_lora_rank=args.rank)
        root = tempfile.mkdtemp()
        adapters = [LoRARequest(f"a{i}", i + 1, write_adapter(f"{root}/a{i}", llm.engine.hf_config, args.rank, i, 1.0))
                    for i in range(4)]
        if not eager:
            graphs = llm.engine.runner.runner.graphs
            run = graphs.run

            def counted(ids, pos, meta, batch):
                nonlocal replays
                replays += batch is not None
                return run(ids, pos, meta, batch)
            graphs.run = counted
        outputs = llm.generate(prompts[:10], SamplingParams(max_tokens=32, ignore_eos=True, temperature=0),
                               use_tqdm=False, lora_request=[([None] + adapters)[i % 5] for i in range(10)])
        tokens[eager] = [o.completions[0].token_ids for o in outputs]
        llm.shutdown()
        del llm
    return {"graphs_equal_eager": tokens[True] == tokens[False], "adapter_graph_replays": replays,
            "distinct_outputs_of_one_prompt": len({tuple(t) for t in tokens[False][:5]})}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--phase", choices=["base", "lora", "graphs"], required=True)
    parser.add_argument("--model", default="llama-3-8b")
    parser.add_argument("--num-prompts", type=int, default=1000)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--decode-len", type=int, default=256)
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (as an engine with LoRA)")
    args = parser.parse_args()
    engine = dict(load_format="dummy", dtype="bfloat16", max_model_len=args.max_model_len,
                  enforce_eager=args.enforce_eager)
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 250) for _ in range(args.input_len)] for _ in range(args.num_prompts)]
    results = {"args": vars(args), "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}

    if args.phase == "graphs":
        results.update(graphs_match_eager(args, [prompts[0]] * 5 + prompts[1:6]))
        print(json.dumps(results), flush=True)
        return
    if args.phase == "base":
        base = LLM(args.model, **engine)
        throughput(base, prompts[:32], 16, None)  # warm-up
        results["base_tokens_per_s"] = throughput(base, prompts, args.output_len, None)
        results["base_decode_tokens_per_s"] = decode_rate(base, prompts[0], args.decode_len, None)
        print(json.dumps(results), flush=True)
        return
    lora = LLM(args.model, enable_lora=True, max_loras=args.adapters, max_cpu_loras=args.adapters,
               max_lora_rank=args.rank, **engine)
    root = tempfile.mkdtemp()
    adapters = [LoRARequest(f"a{i}", i + 1, write_adapter(f"{root}/a{i}", lora.engine.hf_config, args.rank, i))
                for i in range(args.adapters)]
    mix = [adapters[i % (args.adapters + 1)] if i % (args.adapters + 1) < args.adapters else None
           for i in range(args.num_prompts)]
    throughput(lora, prompts[:32], 16, mix[:32])  # warm-up: loads every adapter, compiles the kernels
    results["lora_mix_tokens_per_s"] = throughput(lora, prompts, args.output_len, mix)
    results["lora_decode_tokens_per_s"] = decode_rate(lora, prompts[0], args.decode_len, adapters[0])
    results["lora_engine_base_decode_tokens_per_s"] = decode_rate(lora, prompts[0], args.decode_len, None)
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
