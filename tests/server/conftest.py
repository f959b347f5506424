"""One engine for the whole server suite, and real uvicorn servers over it on free loopback ports.

Loading SmolLM2 is the expensive part, so every server of the suite shares one
AsyncLLM; each server is its own app with its own metrics registry and config
(API keys, limits), which is exactly what ``build_app`` allows.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Iterator

import openai
import pytest
import requests

from fastllm.config import EngineConfig
from fastllm.engine.async_llm import AsyncLLM
from fastllm.entrypoints.openai.api_server import build_app
from fastllm.entrypoints.openai.server_config import ServerConfig
from fastllm.entrypoints.openai.api_server import DrainingServer, uvicorn_config

MODEL = "smol"
HOST = "127.0.0.1"


@dataclass
class RunningServer:
    url: str
    server: DrainingServer
    thread: threading.Thread

    def client(self, api_key: str = "unused", **kwargs) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, **kwargs)

    def async_client(self, api_key: str = "unused", **kwargs) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, **kwargs)

    def post(self, path: str, **kwargs) -> requests.Response:
        return requests.post(f"{self.url}{path}", timeout=120, **kwargs)

    def get(self, path: str, **kwargs) -> requests.Response:
        return requests.get(f"{self.url}{path}", timeout=30, **kwargs)

    def metric(self, name: str) -> float:
        """The value of an unlabelled series in this server's /metrics."""
        for line in self.get("/metrics").text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise KeyError(name)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def start_server(engine: AsyncLLM, **config) -> RunningServer:
    config.setdefault("served_model_names", [MODEL])
    config.setdefault("disable_log_requests", True)
    app = build_app(engine, ServerConfig(**config))
    port = free_port()
    server = DrainingServer(uvicorn_config(app, HOST, port, log_level="warning"), app.state.serving)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started:
        assert thread.is_alive() and time.time() < deadline, "the server did not start"
        time.sleep(0.05)
    return RunningServer(f"http://{HOST}:{port}", server, thread)


@pytest.fixture(scope="session")
def engine(smollm2_path) -> Iterator[AsyncLLM]:
    engine = AsyncLLM(EngineConfig(model=smollm2_path, max_model_len=512, max_num_seqs=64, block_size=16,
                                   enable_prefix_caching=True, cpu_kv_cache_gib=0.5))
    yield engine
    engine.shutdown(timeout=10)


@pytest.fixture(scope="session")
def server(engine) -> Iterator[RunningServer]:
    """The default server: no API key, no queue limit, two names for the one model."""
    running = start_server(engine, served_model_names=[MODEL, "smol-alias"])
    yield running
    running.stop()


@pytest.fixture(scope="session")
def client(server) -> openai.OpenAI:
    return server.client()


def wait_idle(engine: AsyncLLM, timeout: float = 60.0) -> None:
    """Until the engine has no request left and has published stats saying so."""
    deadline = time.time() + timeout
    while engine.stats.num_requests_running or engine.stats.num_requests_waiting or engine.engine.requests:
        assert time.time() < deadline, f"engine still busy: {engine.stats}"
        time.sleep(0.05)
