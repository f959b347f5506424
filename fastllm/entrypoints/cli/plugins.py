"""``fastllm plugins``: every registered name by kind, with the distribution that provided it."""

from __future__ import annotations

import argparse

from fastllm import registry


def run(args: argparse.Namespace) -> int:
    for kind in registry.KINDS:
        print(f"{kind}:")
        entries = registry.entries(kind)
        if not entries:
            print("  (none)")
        for name in sorted(entries):
            print(f"  {name:<28} {entries[name].distribution}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("plugins", help="list registered plugins by kind")
    parser.set_defaults(func=run)
