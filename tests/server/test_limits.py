"""Connection deadlines, docs behind keys, a responsive /health and fair admission."""

from __future__ import annotations

import socket
import threading
import time

import requests

from tests.server.conftest import HOST, MODEL, start_server


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
        return True
    except socket.timeout:
        return False


def test_connections_that_send_nothing_or_too_slowly_are_closed(engine):
    server = start_server(engine, header_timeout=0.5, body_timeout=0.5)
    try:
        port = int(server.url.rsplit(":", 1)[1])
        idle = socket.create_connection((HOST, port))
        slow_header = socket.create_connection((HOST, port))
        slow_header.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        slow_body = socket.create_connection((HOST, port))
        slow_body.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 100\r\n\r\n{\"prompt\":")
        assert _closed_within(idle, 5) and _closed_within(slow_header, 5)
        slow_body.settimeout(5)
        assert b" 408 " in slow_body.recv(4096).split(b"\r\n")[0] + b" "
        for sock in (idle, slow_header, slow_body):
            sock.close()
        assert server.get("/health").status_code == 200
    finally:
        server.stop()


def test_docs_are_off_behind_api_keys_unless_enabled(engine, server):
    keyed = start_server(engine, api_keys=["k"])
    opened = start_server(engine, api_keys=["k"], enable_docs=True)
    try:
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert keyed.get(path).status_code == 404
            assert opened.get(path).status_code == 200
            assert server.get(path).status_code == 200  # no keys: nothing to hide
    finally:
        keyed.stop()
        opened.stop()


def test_health_answers_while_a_big_request_is_admitted(server):
    """2,000 prompts are tokenized, then the last one (too long) fails the request before generation."""
    prompts = ["The quick brown fox jumps over the lazy dog. " * 40] * 1999 + ["hello " * 600]
    big = {"model": MODEL, "prompt": prompts, "max_tokens": 1}
    worker = threading.Thread(target=lambda: server.post("/v1/completions", json=big))
    worker.start()
    latencies = []
    while worker.is_alive() and len(latencies) < 50:
        start = time.perf_counter()
        assert requests.get(f"{server.url}/health", timeout=10).status_code == 200
        latencies.append(time.perf_counter() - start)
        time.sleep(0.05)
    worker.join()
    assert latencies and max(latencies) < 1.0, latencies


def test_a_small_request_is_not_starved_by_a_big_one(server):
    big = {"model": MODEL, "prompt": ["Count: 1, 2, 3,"] * 40, "max_tokens": 4, "ignore_eos": True}
    done: dict[str, float] = {}

    def send(name: str, body: dict) -> None:
        assert server.post("/v1/completions", json=body).ok
        done[name] = time.perf_counter()

    start = time.perf_counter()
    worker = threading.Thread(target=send, args=("big", big))
    worker.start()
    time.sleep(0.5)
    send("small", {"model": MODEL, "prompt": "Hi", "max_tokens": 8, "ignore_eos": True})
    worker.join()
    assert done["small"] < done["big"], (done["small"] - start, done["big"] - start)
