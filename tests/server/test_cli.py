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
    (["--num-scheduler-steps", "8"], "multi-step"),
    (["--max-seq-len-to-capture", "4096"], "CUDA-graph"),
    (["--scheduler-delay-factor", "0.5"], "scheduler delay"),
    (["--tokenizer-extension-path", "/ext/vllm_extension.py"], "tokenizer extensions"),
])
def test_unsupported_flags_stop_the_start(flags, reason):
    with pytest.raises(SystemExit, match=reason):
        main(["serve", *flags])


def test_unknown_plugin_name_fails_before_loading():
    with pytest.raises(UnknownPluginError, match="not-a-quantizer"):
        main(["serve", "--quantization", "not-a-quantizer"])


def test_server_flags_of_the_table_reach_the_engine():
    """Every applicable flag of the AIAK server table lands in EngineConfig (none parsed and then dropped)."""
    args = build_parser().parse_args([
        "serve", "/models/m", "--host", "127.0.0.1", "--port", "8501", "--chat-template", "chatml",
        "--tokenizer", "/models/tok", "--dtype", "bfloat16", "--kv-cache-dtype", "fp8_e4m3", "--max-model-len", "4096",
        "-tp", "2", "-pp", "2", "--distributed-executor-backend", "ray", "--enable-prefix-caching",
        "--gpu-memory-utilization", "0.8", "--max-num-batched-tokens", "1024",
        "--max-num-seqs", "8", "-q", "weight_only_int8", "--enforce-eager", "--enable-chunked-prefill", "false"])
    engine = engine_config_from_args(args)
    assert (args.host, args.port) == ("127.0.0.1", 8501)
    assert engine.model_dump(include={
        "model", "chat_template", "tokenizer", "dtype", "kv_cache_dtype", "max_model_len", "tensor_parallel_size",
        "pipeline_parallel_size", "distributed_executor_backend", "enable_prefix_caching", "gpu_memory_utilization",
        "max_num_batched_tokens", "max_num_seqs", "quantization",
        "enforce_eager", "enable_chunked_prefill"}) == dict(
        model="/models/m", chat_template="chatml", tokenizer="/models/tok", dtype="bfloat16",
        kv_cache_dtype="fp8_e4m3", max_model_len=4096, tensor_parallel_size=2, pipeline_parallel_size=2,
        distributed_executor_backend="ray", enable_prefix_caching=True,
        gpu_memory_utilization=0.8, max_num_batched_tokens=1024, max_num_seqs=8, quantization="weight_only_int8",
        enforce_eager=True, enable_chunked_prefill=False)
    assert build_parser().parse_args(["serve"]).port == 8000


def test_every_documented_environment_variable(monkeypatch):
    """The Angel-vLLM names, each alone, with no flag given."""
    env = {"MODEL": "/data/model", "TP": "4", "QUANTIZATION": "ifq", "GPU_MEMORY_UTILIZATION": "0.95",
           "ENFORCE_EAGER": "true", "REASONING_PARSER": "qwen3", "MAX_WAITING_REQUESTS": "7",
           "ENABLE_AUTO_TOOL_CHOICE": "1", "TRUST_REMOTE_CODE": "false", "MODEL_ID": "Qwen2.5-7B-Instruct"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(["serve"])
    engine = engine_config_from_args(args)
    assert (engine.model, engine.tensor_parallel_size, engine.quantization) == ("/data/model", 4, "ifq")
    assert (engine.gpu_memory_utilization, engine.enforce_eager, engine.reasoning_parser) == (0.95, True, "qwen3")
    assert not args.trust_remote_code
    server = server_config_from_args(args, engine)
    assert server.max_waiting_requests == 7 and server.enable_auto_tool_choice
    assert server.served_model_names == ["Qwen2.5-7B-Instruct"]


@pytest.mark.parametrize("name, value", [("MAX_MODEL_LEN", "abc"), ("TP", "0"), ("DTYPE", "fp64"),
                                         ("GPU_MEMORY_UTILIZATION", "1.5")])
def test_bad_environment_value_stops_the_start_naming_it(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit, match=f"{name}.*{value}"):
        main(["serve"])


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


# Room for the short request's few tokens on a busy 2-core machine; the drain waits all of it.
SHUTDOWN_TIMEOUT = 4.0


def wait_until_up(process: subprocess.Popen, url: str) -> None:
    deadline = time.time() + 180
    while True:
        assert process.poll() is None and time.time() < deadline, "the server did not come up"
        try:
            if requests.get(f"{url}/health", timeout=1).ok:
                return
        except requests.ConnectionError:
            time.sleep(0.5)


def refuses_new_requests(url: str) -> bool:
    """True once a new request is turned away: connection refused, or 503 on a connection still open."""
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            if requests.get(f"{url}/health", timeout=1).status_code == 503:
                return True
        except requests.ConnectionError:
            return True
        time.sleep(0.05)
    return False


def test_sigterm_drains_in_flight_requests_then_exits(smollm2_path):
    """SIGTERM on a real process: no new requests; a short request in flight finishes; one that cannot finish
    within --shutdown-timeout is aborted, its stream ending cleanly; the process exits 0 soon after."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("API_KEYS", "SERVED_MODEL_NAME", "MODEL_ID")}
    process = subprocess.Popen(
        [sys.executable, "-m", "fastllm.entrypoints.cli.main", "serve", smollm2_path, "--host", HOST, "--port",
         str(port), "--served-model-name", "sub", "--max-model-len", "1024", "--max-num-seqs", "4",
         "--num-gpu-blocks-override", "64",  # 4 full contexts: the 2 GiB serving default takes seconds to zero
         "--shutdown-timeout", str(SHUTDOWN_TIMEOUT), "--uvicorn-log-level", "warning"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://{HOST}:{port}"
    try:
        wait_until_up(process, url)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        common = dict(model="sub", temperature=0, stream=True, extra_body={"ignore_eos": True})
        short = client.completions.create(prompt="Once upon a time", max_tokens=6, **common)
        long = client.completions.create(prompt="A very long story:", max_tokens=1000, **common)
        short_chunks, long_chunks = [next(iter(short))], [next(iter(long))]
        signalled = time.time()
        process.send_signal(signal.SIGTERM)

        short_chunks += list(short)
        assert short_chunks[-1].choices[0].finish_reason == "length"
        assert refuses_new_requests(url)
        long_chunks += list(long)
        assert time.time() - signalled >= SHUTDOWN_TIMEOUT - 0.5  # it had its full time to finish
        assert len(long_chunks) < 1000 and long_chunks[-1].choices[0].finish_reason == "abort"
        assert process.wait(timeout=60) == 0
        assert time.time() - signalled < SHUTDOWN_TIMEOUT + 20
    finally:
        if process.poll() is None:
            process.kill()
        output = process.communicate()[0]
    assert "Traceback" not in output, output
