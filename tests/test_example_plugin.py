"""A third-party plugin installed with pip is discovered through its entry point and used."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TINY_LLAMA

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "fastllm-plugin-example"

SCRIPT = """
import json, sys
from fastllm import LLM, SamplingParams, registry
from fastllm_plugin_example.model import SoftCapLlamaForCausalLM
entry = registry.entries("models")["SoftCapLlamaForCausalLM"]
llm = LLM(sys.argv[1], load_format="dummy", num_gpu_blocks_override=16, block_size=16)
out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)[0]
print(json.dumps({"distribution": entry.distribution, "instances": SoftCapLlamaForCausalLM.instances,
                  "tokens": out.outputs.token_ids}))
"""


@pytest.fixture(scope="module")
def installed_env(tmp_path_factory) -> dict[str, str]:
    """The environment of a process that sees the example plugin pip-installed (once for this module)."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(EXAMPLE)], check=True)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")])}


def test_installed_plugin_model_is_used(tmp_path, installed_env):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({**TINY_LLAMA, "architectures": ["SoftCapLlamaForCausalLM"]}))
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(model_dir)], env=installed_env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["distribution"].startswith("fastllm-plugin-example")
    assert result["instances"] == 1 and len(result["tokens"]) == 4
    listing = subprocess.run([sys.executable, "-m", "fastllm.entrypoints.cli.main", "plugins"], env=installed_env,
                             capture_output=True, text=True, timeout=120)
    assert "SoftCapLlamaForCausalLM" in listing.stdout and "fastllm-plugin-example" in listing.stdout


def test_plugin_passes_the_conformance_kit(tmp_path, installed_env):
    """The example plugin's own tests, run as its author would, against the installed plugin."""
    run = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "--rootdir",
                          str(tmp_path), str(EXAMPLE / "tests")], env=installed_env, capture_output=True, text=True,
                         timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert " 1 passed" in run.stdout

