"""``fastllm serve``: refused flags, environment variables, and a real process draining on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import openai
import pytest
import requests

from fastllm.entrypoints.cli.engine_args import engine_config_from_args
from fastllm.entrypoints.cli.main import build_parser, main
from fastllm.entrypoints.cli.serve import server_config_from_args
from fastllm.registry import UnknownPluginError
from tests.server.conftest import HOST, free_port


@pytest.mark.parametrize("flags, reason", [
    (["--lora-modules", "sql=/loras/sql"], "LoRA"),
    (["--pipeline-parallel-size", "2"], "pipeline parallelism"),
    (["--num-scheduler-steps", "8"], "multi-step"),
    (["--distributed-executor-backend", "ray"], "executor backend"),
    (["--max-seq-len-to-capture", "4096"], "CUDA-graph"),
])
def test_unsupported_flags_stop_the_start(flags, reason):
    with pytest.raises(SystemExit, match=reason):
        main(["serve", *flags])


def test_unknown_plugin_name_fails_before_loading():
    with pytest.raises(UnknownPluginError, match="not-a-quantizer"):
        main(["serve", "--quantization", "not-a-quantizer"])


def test_environment_variables_fill_unset_flags(monkeypatch):
    env = {"MAX_MODEL_LEN": "256", "DTYPE": "float32", "ENABLE_PREFIX_CACHING": "false", "USE_LOOKAHEAD": "1",
           "NUM_SPECULATIVE_TOKENS": "4", "API_KEYS": "k1,k2", "SERVED_MODEL_NAME": "model_123",
           "DISABLE_LOG_REQUESTS": "1", "TOOL_CALL_PARSER": "hermes"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(["serve"])
    engine = engine_config_from_args(args)
    assert (engine.max_model_len, engine.dtype, engine.enable_prefix_caching) == (256, "float32", False)
    assert engine.speculative_config == {"method": "lookahead", "num_speculative_tokens": 4}
    assert engine.tool_call_parser == "hermes"
    server = server_config_from_args(args, engine)
    assert server.api_keys == ["k1", "k2"] and server.served_model_names == ["model_123"]
    assert server.disable_log_requests

    args = build_parser().parse_args(["serve", "--max-model-len", "128", "--num-speculative-tokens", "2",
                                      "--api-keys", "flag-key", "--served-model-name", "a", "b",
                                      "--enable-chunked-prefill", "false"])
    engine = engine_config_from_args(args)
    assert engine.max_model_len == 128 and engine.speculative_config["num_speculative_tokens"] == 2
    assert not engine.enable_chunked_prefill
    server = server_config_from_args(args, engine)
    assert server.api_keys == ["flag-key"] and server.served_model_names == ["a", "b"]


def test_serve_process_finishes_in_flight_requests_on_sigterm(smollm2_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("API_KEYS", "SERVED_MODEL_NAME", "MODEL_ID")}
    process = subprocess.Popen(
        [sys.executable, "-m", "fastllm.entrypoints.cli.main", "serve", smollm2_path, "--host", HOST, "--port",
         str(port), "--served-model-name", "sub", "--max-model-len", "256", "--max-num-seqs", "4",
         "--uvicorn-log-level", "warning"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://{HOST}:{port}"
    try:
        deadline = time.time() + 180
        while True:
            assert process.poll() is None and time.time() < deadline, "the server did not come up"
            try:
                if requests.get(f"{url}/health", timeout=1).ok:
                    break
            except requests.ConnectionError:
                time.sleep(0.5)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        stream = client.completions.create(model="sub", prompt="Once upon a time", max_tokens=12, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
        chunks = [next(iter(stream))]
        process.send_signal(signal.SIGTERM)
        chunks += list(stream)
        assert chunks[-1].choices[0].finish_reason == "length"
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
        output = process.communicate()[0]
    assert "Traceback" not in output, output
