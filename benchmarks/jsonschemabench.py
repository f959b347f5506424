"""Structured outputs on real-world schemas: a seeded JSONSchemaBench sample through each
structured-output backend (xgrammar, llguidance and the ``auto`` router), on SmolLM2's vocabulary.

Per split and backend, strict (the default): how many schemas compile and how many are refused
(each refusal's reason is printed with ``--reasons``); compile time p50/p99; the maskbench test
documents fed token by token through the matcher (each token checked against the mask, the
stop token at the end): valid ones accepted, invalid ones rejected, and ``unsound`` (invalid
documents accepted: the backend under-constrains) which must stay 0; mask time per token.
With ``--generate N`` the first N schemas of each split are also sent through ``LLM.generate``
(embedded SmolLM2, CPU): outputs that finish valid, finish **invalid** (must stay 0), are cut
by ``--max-tokens``, or are refused.

Validity is ``jsonschema``'s, with the schema's own draft; ``format`` is not asserted (an
annotation by default in JSON Schema). Sample: ``benchmarks/data/jsonschemabench_sample.jsonl``
(drawn by ``jsonschemabench_draw.py``).

    python benchmarks/jsonschemabench.py                         # compile + test documents
    python benchmarks/jsonschemabench.py --generate 4 --max-tokens 192
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Optional

import jsonschema
import torch

from fastllm import registry
from fastllm.model_loader.resolve import embedded_model_path, load_tokenizer, resolve_load_format
from fastllm.sampling_params import GuidedDecodingParams
from fastllm.structured_output.router import BackendRouter

SAMPLE = Path(__file__).parent / "data" / "jsonschemabench_sample.jsonl"
SPLITS = ("Github_easy", "Github_medium", "Github_hard", "Glaiveai2K", "Kubernetes", "Snowplow", "WashingtonPost",
          "JsonSchemaStore")
BACKENDS = ("xgrammar", "llguidance", "auto")


def load_sample(limit: Optional[int], splits: Optional[list[str]] = None,
                ids: Optional[list[str]] = None) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line]
    rows = [row for row in rows if (splits is None or row["split"] in splits)
            and (ids is None or f"{row['split']}/{row['id']}" in ids)]
    per_split: dict[str, int] = defaultdict(int)
    kept = []
    for row in rows:
        if limit is None or per_split[row["split"]] < limit:
            per_split[row["split"]] += 1
            kept.append(row)
    return kept


def is_valid(schema: Any, document: Any) -> bool:
    try:
        validator = jsonschema.validators.validator_for(schema)(schema)
        return validator.is_valid(document)
    except (jsonschema.exceptions.SchemaError, jsonschema.exceptions.RefResolutionError, ValueError,
            KeyError, TypeError):
        return False


def percentile(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


class Walker:
    """Feeds a token sequence through one backend's matcher (``accept_prefix``, the stop token at
    the end); the first ``masked`` tokens of each document also go through the mask, each checked
    against it, which times the mask (a mask per token of every document costs too much CPU)."""

    def __init__(self, backend: Any, vocab_size: int, stop_token: int, masked: int):
        self.backend, self.stop_token, self.masked = backend, stop_token, masked
        self.logits = torch.zeros(1, vocab_size)
        self.mask_s, self.masks, self.disagreements = 0.0, 0, 0

    def accepts(self, compiled: Any, tokens: list[int]) -> bool:
        tokens = tokens + [self.stop_token]
        accepted = self.backend.accept_prefix(self.backend.new_matcher(compiled), tokens)
        matcher = self.backend.new_matcher(compiled)
        for position, token in enumerate(tokens[:self.masked]):
            self.logits.zero_()
            start = time.perf_counter()
            self.backend.apply_bitmask(self.logits, [matcher])
            self.mask_s += time.perf_counter() - start
            self.masks += 1
            allowed = bool(self.logits[0, token] != float("-inf"))
            self.disagreements += allowed != (position < accepted)  # mask and matcher must agree
            if not allowed:
                break
            self.backend.accept_prefix(matcher, [token])
        return accepted == len(tokens)


def check_documents(backends: dict[str, Any], rows: list[dict[str, Any]], tokenizer: Any, vocab_size: int,
                    show_reasons: bool, docs: int, masked: int) -> dict[tuple[str, str], dict[str, Any]]:
    stats: dict[tuple[str, str], dict[str, Any]] = defaultdict(lambda: defaultdict(int))
    for name, backend in backends.items():
        walker = Walker(backend, vocab_size, tokenizer.eos_token_id, masked)
        for row in rows:
            cell = stats[(name, row["split"])]
            cell.setdefault("compile_s", [])
            start = time.perf_counter()
            try:
                compiled = backend.compile(GuidedDecodingParams(json=row["schema"], strict=True))
            except ValueError as exc:
                cell["refused"] += 1
                reason = str(exc) or "(no message)"
                cell["empty_reasons"] += not str(exc).strip()
                if show_reasons:
                    print(f"  {name:<10} {row['split']}/{row['id']}: {reason[:400]}", flush=True)
                continue
            cell["compile_s"].append(time.perf_counter() - start)
            if show_reasons and cell["compile_s"][-1] > 2.0:
                print(f"  slow compile {name} {row['split']}/{row['id']}: {cell['compile_s'][-1]:.1f} s", flush=True)
            cell["compiled"] += 1
            tests = [t for t in row["tests"] if t["valid"]][:docs] + [t for t in row["tests"] if not t["valid"]][:docs]
            for test in tests:
                text = json.dumps(test["data"], ensure_ascii=False)  # the backends' one-line form
                accepted = walker.accepts(compiled, tokenizer.encode(text, add_special_tokens=False))
                valid = is_valid(row["schema"], test["data"])
                cell["valid_accepted" if valid and accepted else "valid_rejected" if valid else
                     "unsound" if accepted else "invalid_rejected"] += 1
                if show_reasons and accepted != valid:
                    print(f"  {'UNSOUND' if accepted else 'valid rejected'} {name} {row['split']}/{row['id']}: "
                          f"{text[:200]}")
        stats[(name, "*mask")]["mask_s"] = walker.mask_s
        stats[(name, "*mask")]["masks"] = walker.masks
        stats[(name, "*mask")]["disagreements"] = walker.disagreements
    return stats


def generate(rows: list[dict[str, Any]], per_split: int, max_tokens: int, seed: int,
             show_reasons: bool, backends: list[str]) -> dict[tuple[str, str], dict[str, int]]:
    from fastllm import LLM, SamplingParams

    picked = load_sample_subset(rows, per_split)
    stats: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for name in backends:
        llm = LLM(embedded_model_path(), max_model_len=2048, num_gpu_blocks_override=512,
                  structured_output_backend=name, seed=seed)
        prompts, params = [], []
        for row in picked:
            schema_text = json.dumps(row["schema"], separators=(",", ":"))[:1200]
            prompts.append(llm.tokenizer.apply_chat_template(
                [{"role": "user", "content": f"Write one JSON document for this JSON schema:\n{schema_text}"}],
                tokenize=False, add_generation_prompt=True))
            params.append(SamplingParams(temperature=0.6, seed=seed, max_tokens=max_tokens,
                                         guided_decoding={"json": row["schema"]}))
        for row, output in zip(picked, llm.generate(prompts, params, use_tqdm=False)):
            cell = stats[(name, row["split"])]
            reason = output.outputs.finish_reason
            if output.error_code != 200 or reason == "error":
                cell["refused"] += 1
                if show_reasons:
                    print(f"  {name:<10} {row['split']}/{row['id']}: {output.error_msg}")
            elif reason == "length":
                cell["cut"] += 1
            else:
                try:
                    document = json.loads(output.outputs.text)
                    cell["valid" if is_valid(row["schema"], document) else "invalid"] += 1
                except ValueError:
                    cell["invalid"] += 1
                if show_reasons and cell["invalid"]:
                    print(f"  INVALID {name} {row['split']}/{row['id']}: {output.outputs.text[:200]}")
        del llm
    return stats


def load_sample_subset(rows: list[dict[str, Any]], per_split: int) -> list[dict[str, Any]]:
    counts: dict[str, int] = defaultdict(int)
    picked = []
    for row in rows:
        if counts[row["split"]] < per_split:
            counts[row["split"]] += 1
            picked.append(row)
    return picked


def print_documents(stats: dict[tuple[str, str], dict[str, Any]], splits: list[str],
                    names: tuple[str, ...] = BACKENDS) -> None:
    print("| backend | split | compiled | refused | compile p50 ms | p99 ms | valid docs accepted | "
          "invalid docs rejected | unsound |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in names:
        total: dict[str, Any] = defaultdict(int, compile_s=[])
        for split in splits + ["all"]:
            cell = total if split == "all" else stats[(name, split)]
            if split != "all":
                for key, value in cell.items():
                    total[key] += value
            times = cell.get("compile_s", [])
            valid = cell["valid_accepted"] + cell["valid_rejected"]
            invalid = cell["invalid_rejected"] + cell["unsound"]
            print(f"| {name} | {split} | {cell['compiled']} | {cell['refused']} | "
                  f"{1e3 * statistics.median(times) if times else float('nan'):.1f} | "
                  f"{1e3 * percentile(times, 0.99):.1f} | {cell['valid_accepted']}/{valid} | "
                  f"{cell['invalid_rejected']}/{invalid} | {cell['unsound']} |")
        mask = stats[(name, "*mask")]
        print(f"| {name} | mask per token | {1e6 * mask['mask_s'] / max(1, mask['masks']):.0f} us | "
              f"{mask['masks']} masks | mask/matcher disagreements: {mask['disagreements']} | | | | |")


def print_generation(stats: dict[tuple[str, str], dict[str, int]], splits: list[str], backends: list[str]) -> None:
    print("\n| backend | split | valid | invalid | cut | refused |")
    print("|---|---|---|---|---|---|")
    for name in backends:
        total: dict[str, int] = defaultdict(int)
        for split in splits + ["all"]:
            cell = total if split == "all" else stats[(name, split)]
            if split != "all":
                for key, value in cell.items():
                    total[key] += value
            print(f"| {name} | {split} | {cell['valid']} | {cell['invalid']} | {cell['cut']} | {cell['refused']} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="schemas per split (default: all)")
    parser.add_argument("--generate", type=int, default=0, help="schemas per split to generate for")
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--generate-backends", default=",".join(BACKENDS), help="comma-separated, for --generate")
    parser.add_argument("--no-documents", action="store_true", help="skip the compile and document table")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reasons", action="store_true", help="print every refusal's reason")
    parser.add_argument("--docs", type=int, default=2, help="valid and invalid test documents per schema")
    parser.add_argument("--masked", type=int, default=8, help="leading tokens of each document also masked")
    parser.add_argument("--splits", default=None, help="comma-separated splits (default: all)")
    parser.add_argument("--ids", default=None, help="comma-separated split/id of the schemas to run (default: all)")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated, for the document table")
    parser.add_argument("--json", default=None, help="also write the document table's counts here")
    parser.add_argument("--merge", nargs="+", default=None, help="print one table from several --json files")
    args = parser.parse_args()
    if args.merge:
        merged: dict[tuple[str, str], dict[str, Any]] = defaultdict(lambda: defaultdict(int))
        for path in args.merge:
            for key, cell in json.loads(Path(path).read_text()):
                for field, value in cell.items():
                    merged[tuple(key)][field] = merged[tuple(key)].get(field, [] if isinstance(value, list) else 0) + value
        print_documents(merged, [split for split in SPLITS if any(key[1] == split for key in merged)])
        return
    rows = load_sample(args.limit, args.splits.split(",") if args.splits else None,
                       args.ids.split(",") if args.ids else None)
    splits = list(dict.fromkeys(row["split"] for row in rows))
    path = embedded_model_path()
    loader = registry.get("load_formats", resolve_load_format(path, "auto"))()
    tokenizer = load_tokenizer(loader, path, None)
    vocab_size = loader.load_config(path).vocab_size
    backends = {name: registry.get("structured_output_backends", name)(tokenizer, vocab_size)
                for name in BACKENDS if name != "auto"}
    # auto routes over these same backends: its grammars come from their caches, so its compile
    # times are the routing's own; a grammar's first compile is timed in its backend's rows
    backends["auto"] = BackendRouter({name: (lambda backend=backend: backend) for name, backend in backends.items()})
    print(f"{len(rows)} schemas, {len(splits)} splits, strict\n")
    if not args.no_documents:
        chosen = tuple(args.backends.split(","))
        stats = check_documents({name: backends[name] for name in chosen}, rows, tokenizer, vocab_size, args.reasons,
                                args.docs, args.masked)
        print_documents(stats, splits, chosen)
        if args.json:
            Path(args.json).write_text(json.dumps([[list(key), cell] for key, cell in stats.items()]))
    if args.generate:
        chosen = args.generate_backends.split(",")
        print_generation(generate(rows, args.generate, args.max_tokens, args.seed, args.reasons, chosen), splits,
                         chosen)

if __name__ == "__main__":
    main()
