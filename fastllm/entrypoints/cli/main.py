"""``fastllm`` command line: each subcommand is a module with ``register(subparsers)``."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from fastllm import registry

SUBCOMMANDS = (
    "fastllm.entrypoints.cli.generate",
    "fastllm.entrypoints.cli.chat",
    "fastllm.entrypoints.cli.plugins",
    "fastllm.entrypoints.cli.bench",
    "fastllm.entrypoints.cli.serve",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fastllm", description="fastllm inference engine")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS:
        importlib.import_module(module).register(subparsers)
    for entry in registry.entries("cli_commands").values():
        entry.factory(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
