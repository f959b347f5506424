"""Draw the seeded JSONSchemaBench sample that ``benchmarks/jsonschemabench.py`` reads.

Reads a git mirror of github.com/guidance-ai/jsonschemabench (its ``maskbench/data`` records:
a schema and valid / invalid test documents each) and writes one compact JSON line per schema:
``{"split", "id", "schema", "tests": [{"valid", "data"}]}``. Schemas over ``--max-chars`` are
skipped before the draw (they would make the file large), and at most ``--tests`` valid and
``--tests`` invalid documents are kept per schema.

    python benchmarks/jsonschemabench_draw.py /work/.mirror/guidance-ai+jsonschemabench/repo
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
from pathlib import Path

SPLITS = ("Github_easy", "Github_medium", "Github_hard", "Glaiveai2K", "Kubernetes", "Snowplow",
          "WashingtonPost", "JsonSchemaStore")
OUT = Path(__file__).parent / "data" / "jsonschemabench_sample.jsonl"


def git(mirror: str, *args: str) -> str:
    return subprocess.run(["git", "-C", mirror, *args], check=True, capture_output=True, text=True).stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mirror", help="a git directory of guidance-ai/jsonschemabench")
    parser.add_argument("--per-split", type=int, default=40)
    parser.add_argument("--max-chars", type=int, default=12000)
    parser.add_argument("--tests", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    listing = [line.split(None, 4) for line in git(args.mirror, "ls-tree", "-r", "-l", "HEAD",
                                                   "maskbench/data").splitlines()]
    lines = []
    for split in SPLITS:
        paths = sorted(path for _, _, _, size, path in listing
                       if path.split("/")[-1].startswith(split + "---") and size.isdigit()
                       and int(size) < 4 * args.max_chars)
        rng.shuffle(paths)
        taken = 0
        for path in paths:
            record = json.loads(git(args.mirror, "show", f"HEAD:{path}"))
            schema = record["schema"]
            if len(json.dumps(schema)) > args.max_chars:
                continue
            tests = [t for t in record.get("tests", []) if t["valid"]][:args.tests]
            tests += [t for t in record.get("tests", []) if not t["valid"]][:args.tests]
            lines.append(json.dumps({"split": split, "id": path.split("---", 1)[1], "schema": schema,
                                     "tests": [{"valid": t["valid"], "data": t["data"]} for t in tests]},
                                    ensure_ascii=False, separators=(",", ":")))
            taken += 1
            if taken == args.per_split:
                break
    OUT.write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} schemas, {OUT.stat().st_size / 1e6:.2f} MB -> {OUT}")


if __name__ == "__main__":
    main()
