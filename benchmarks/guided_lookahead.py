"""Lookahead drafts on guided requests, batch 1: JSON extraction from a document in the prompt,
with a schema whose string values are copied from it (the most copy-heavy guided workload).

Each request runs on a plain engine and on a lookahead engine (same backend, the order
alternating); their outputs must agree token for token, greedy and, with ``--temperatures``
above 0, under seeded sampling (request i's seed is ``--seed + i``). Reported per temperature:
tokens per step (tokens after the first over the steps after the first), draft acceptance,
decode tokens per second of each engine, and whether each output is valid against the schema.

    python benchmarks/guided_lookahead.py                      # embedded SmolLM2, CPU, xgrammar
    python benchmarks/guided_lookahead.py --backend llguidance --temperatures 0 0.7
    python -P benchmarks/guided_lookahead.py --model SmolLM2-135M-Instruct.Q4_1.gguf --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import jsonschema

from fastllm import LLM, SamplingParams
from fastllm.model_loader.resolve import embedded_model_path

sys.path.insert(0, str(Path(__file__).parent))
from lookahead import Engine, document, summarize  # noqa: E402  (the copy workload's documents)

SCHEMA = {"type": "object", "additionalProperties": False,
          "required": ["first_sentence", "people", "places", "last_sentence"],
          "properties": {"first_sentence": {"type": "string"},
                         "people": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
                         "places": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
                         "last_sentence": {"type": "string"}}}


def prompt(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": "Extract from the text below, as JSON with the keys first_sentence, people, "
                                        "places and last_sentence (the first and last sentences copied exactly)."
                                        f"\n\n{text}"}]


def measure(engines: dict[str, Engine], documents: list[str], params: list[SamplingParams]) -> dict:
    """Each document on both engines in turn; the outputs compared and the plain one validated."""
    runs: dict[str, list] = {name: [] for name in engines}
    valid = same = 0
    for i, (text, request) in enumerate(zip(documents, params)):
        outputs = {}
        for name in sorted(engines, reverse=i % 2 == 1):
            run, outputs[name] = engines[name].run(prompt(text), request)
            runs[name].append(run)
        same += outputs["plain"] == outputs["lookahead"]
        decoded = engines["plain"].llm.tokenizer.decode(outputs["plain"], skip_special_tokens=True)
        try:
            jsonschema.validate(json.loads(decoded), SCHEMA)
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    report = {name: summarize(r) for name, r in runs.items()}
    report["identical_outputs"] = f"{same}/{len(documents)}"
    report["valid_outputs"] = f"{valid}/{len(documents)}"
    report["decode_speedup"] = round(report["lookahead"]["decode_tok_s"] / report["plain"]["decode_tok_s"], 2)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M GGUF")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--backend", default="xgrammar")
    parser.add_argument("--num-prompts", type=int, default=6)
    parser.add_argument("--doc-sentences", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--num-speculative-tokens", type=int, default=8)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0],
                        help="0: greedy; above 0: seeded sampling at that temperature")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    model = args.model or embedded_model_path()
    common = {"dtype": args.dtype, "max_model_len": 2048, "num_gpu_blocks_override": 256,
              "structured_output_backend": args.backend}
    spec = {"method": "lookahead", "num_speculative_tokens": args.num_speculative_tokens}
    engines = {"plain": Engine(LLM(model, **common)),
               "lookahead": Engine(LLM(model, speculative_config=spec, **common))}
    guided = {"max_tokens": args.max_tokens, "guided_decoding": {"json": SCHEMA}}
    for engine in engines.values():  # warm-up: the first compile and the first steps are not timed
        engine.run(prompt(document(rng, 2)), SamplingParams(temperature=0.0, **guided))
    documents = [document(rng, args.doc_sentences) for _ in range(args.num_prompts)]
    report = {}
    for temperature in args.temperatures:
        params = [SamplingParams(temperature=temperature, seed=None if temperature == 0 else args.seed + i, **guided)
                  for i in range(args.num_prompts)]
        report["greedy" if temperature == 0 else f"seeded, temperature {temperature}"] = measure(
            engines, documents, params)
    print(json.dumps(report, indent=2))
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
