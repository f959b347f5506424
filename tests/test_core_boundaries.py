"""The core names no plugin and no CUDA outside ``fastllm/platforms``: a plugin is chosen through
the registry (by the user's name, or as the only one registered), and only the platform knows
the hardware. Read from the source's syntax tree, so prose in docstrings and comments is free."""

from __future__ import annotations

import ast
from pathlib import Path

from fastllm import registry
from fastllm.registry.registry import BUILTIN_DISTRIBUTION

CORE = Path(__file__).resolve().parents[1] / "fastllm"
PLATFORMS = CORE / "platforms"
# Kinds whose plugin the core once chose by name; their registered names must not appear as literals.
CHOSEN_KINDS = ("quantizers", "lm_head_quantizers", "speculative_decoders", "structured_output_backends",
                "adapter_managers")
CORE_VOCABULARY = {"fp8"}  # a KV-cache dtype of the core's own, also a quantizer's name


def core_sources() -> list[Path]:
    return [path for path in sorted(CORE.rglob("*.py")) if PLATFORMS not in path.parents]


def plugin_names() -> set[str]:
    """Names that in-tree plugins register for the chosen kinds (built-in entries excluded)."""
    return {entry.name for kind in CHOSEN_KINDS for entry in registry.entries(kind).values()
            if entry.distribution.split(" ")[0] != BUILTIN_DISTRIBUTION} - CORE_VOCABULARY


def findings(path: Path, forbidden: set[str], root: Path = CORE.parent) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    where = path.relative_to(root)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "cuda" and isinstance(node.value, ast.Name) \
                and node.value.id == "torch":
            found.append(f"{where}:{node.lineno}: torch.cuda")
        elif isinstance(node, ast.Attribute) and node.attr == "is_cuda":
            found.append(f"{where}:{node.lineno}: .is_cuda")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in forbidden:
            found.append(f"{where}:{node.lineno}: {node.value!r}")
    return found


def test_plugin_names_are_known():
    """The check has something to look for: the in-tree plugins are installed."""
    assert {"lora", "weight_only_int8", "xgrammar", "lookahead"} <= plugin_names()


def test_core_names_no_plugin_and_no_cuda():
    forbidden = plugin_names() | {"cuda"}
    assert [line for path in core_sources() for line in findings(path, forbidden)] == []


def test_findings_catch_what_they_should(tmp_path):
    """The checker itself: a lookup by a plugin's name and CUDA checks are found, prose is not."""
    source = tmp_path / "sample.py"
    source.write_text('"""Served by the lora plugin on cuda."""\nimport torch\n'
                      'x = registry.get("adapter_managers", "lora")\ny = device.type == "cuda"\n'
                      'torch.cuda.synchronize()\nz = cache.is_cuda\n')
    assert sorted(findings(source, {"lora", "cuda"}, tmp_path)) == [
        "sample.py:3: 'lora'", "sample.py:4: 'cuda'", "sample.py:5: torch.cuda", "sample.py:6: .is_cuda"]
