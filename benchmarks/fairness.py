"""Fairness: how long a small request waits behind a big one on a real server.

One client sends a completion with 2,000 prompts (and drops it once the measurement is
taken); a second client sends an 8-token request a second later. The table
gives the small request's latency beside its latency on an idle server. ``--unfair`` runs the
same with fair admission off (a window as large as the whole request), to show what it fixes;
that run gives up waiting after ``--give-up`` seconds.

    python benchmarks/fairness.py                 # embedded SmolLM2 on this machine
    python benchmarks/fairness.py --unfair        # and the same without fair admission
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import threading
import time
from typing import Optional

import requests
import uvicorn

from fastllm.config import EngineConfig
from fastllm.engine.async_llm import AsyncLLM
from fastllm.entrypoints.openai.api_server import DrainingServer, build_app, uvicorn_config
from fastllm.entrypoints.openai.server_config import ServerConfig
from fastllm.model_loader.resolve import embedded_model_path

HOST = "127.0.0.1"
MODEL = "model"


def serve(engine: AsyncLLM) -> tuple[str, DrainingServer]:
    app = build_app(engine, ServerConfig(served_model_names=[MODEL], disable_log_requests=True))
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port = sock.getsockname()[1]
    config: uvicorn.Config = uvicorn_config(app, HOST, port, log_level="warning")
    server = DrainingServer(config, app.state.serving)
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return f"http://{HOST}:{port}", server


def small_latency(url: str, timeout: float) -> Optional[float]:
    start = time.perf_counter()
    try:
        response = requests.post(f"{url}/v1/completions", timeout=timeout, json={
            "model": MODEL, "prompt": "The capital of France is", "max_tokens": 8, "ignore_eos": True})
    except requests.Timeout:
        return None
    response.raise_for_status()
    return time.perf_counter() - start


def behind_big(url: str, num_prompts: int, max_tokens: int, delay: float, give_up: float) -> Optional[float]:
    """The small request's latency, sent ``delay`` s after the big one. The big one is sent on a
    connection that is never read and closed afterwards, which aborts what is left of it."""
    prompts = [f"Story {i}: once upon a time, a robot" for i in range(num_prompts)]
    host, port = url.removeprefix("http://").split(":")
    big = http.client.HTTPConnection(host, int(port))
    big.request("POST", "/v1/completions", headers={"content-type": "application/json"}, body=json.dumps(
        {"model": MODEL, "prompt": prompts, "max_tokens": max_tokens}))
    time.sleep(delay)
    latency = small_latency(url, give_up)
    big.close()
    return latency


def run(window: Optional[int], args: argparse.Namespace) -> tuple[float, Optional[float]]:
    config = EngineConfig(model=args.model or embedded_model_path(), max_model_len=args.max_model_len,
                          max_num_seqs=args.max_num_seqs)
    engine = AsyncLLM(config, request_window=window)
    url, server = serve(engine)
    try:
        small_latency(url, 600)  # warm-up
        idle = small_latency(url, 600)
        loaded = behind_big(url, args.num_prompts, args.max_tokens, args.delay, args.give_up)
    finally:
        server.should_exit = True
        engine.shutdown(timeout=0)
    return idle, loaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="default: the embedded SmolLM2")
    parser.add_argument("--num-prompts", type=int, default=2000)
    parser.add_argument("--max-tokens", type=int, default=16, help="of each of the big request's prompts")
    parser.add_argument("--delay", type=float, default=1.0, help="seconds between the big and the small request")
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--give-up", type=float, default=120.0)
    parser.add_argument("--unfair", action="store_true", help="also run with fair admission off")
    parser.add_argument("--windows", type=int, nargs="*", default=[], help="also run with these request windows")
    args = parser.parse_args()
    modes = [("fair admission (default window)", None)]
    modes += [(f"fair admission, window {window}", window) for window in args.windows]
    if args.unfair:
        modes.append(("fair admission off", args.num_prompts * args.max_num_seqs))
    print(f"{args.num_prompts} prompts x {args.max_tokens} tokens, then an 8-token request {args.delay} s later; "
          f"max_num_seqs {args.max_num_seqs}")
    print("| mode | small request alone (s) | small request behind the big one (s) |")
    print("| --- | --- | --- |")
    for name, window in modes:
        idle, loaded = run(window, args)
        shown = f"{loaded:.2f}" if loaded is not None else f"> {args.give_up:.0f} (gave up)"
        print(f"| {name} | {idle:.2f} | {shown} |", flush=True)


if __name__ == "__main__":
    main()
