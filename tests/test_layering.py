"""The engine imports the executor, the executor imports the worker, never back: the runner side
reads plain data, so it could run in another process or on another host."""

from __future__ import annotations

import ast
from pathlib import Path

import fastllm

ROOT = Path(fastllm.__file__).parent
# package (or plugin module folder) -> the fastllm packages it must not import
FORBIDDEN = {
    "worker": ("fastllm.engine", "fastllm.executor"),
    "executor": ("fastllm.engine",),
    "sampling": ("fastllm.engine", "fastllm.executor", "fastllm.worker"),
    "spec_decode": ("fastllm.engine", "fastllm.executor", "fastllm.worker"),
}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_runner_side_packages_do_not_import_the_engine():
    lookahead = ROOT.parent / "plugins" / "fastllm-plugin-lookahead" / "fastllm_lookahead"
    folders = {name: ROOT / name for name in FORBIDDEN} | {"lookahead": lookahead}
    rules = FORBIDDEN | {"lookahead": ("fastllm.engine",)}
    found = []
    for name, folder in folders.items():
        files = sorted(folder.glob("*.py"))
        assert files, folder
        for path in files:
            found += [f"{path.name}: {module}" for module in _imports(path)
                      if module.startswith(rules[name])]
    assert found == []
