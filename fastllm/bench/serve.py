"""``fastllm bench serve``: load a running OpenAI-compatible server the way vLLM's benchmark_serving does.

Requests arrive as a Poisson process (``--request-rate``; ``inf`` sends them all
at once), at most ``--max-concurrency`` in flight, each streamed so that time to
first token and the gaps between tokens can be measured on the client. Token
counts come from the server's ``usage`` (``stream_options.include_usage``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import time
from dataclasses import asdict
from datetime import datetime
from typing import Any

from fastllm import registry
from fastllm.bench.datasets import BenchRequest, random_requests, sharegpt_requests
from fastllm.bench.stats import RequestResult, summarize
from fastllm.bench.table import print_summary
from fastllm.model_loader.resolve import embedded_model_path, load_tokenizer, resolve_load_format


def server_tokenizer(args: argparse.Namespace) -> Any:
    """The tokenizer the server uses: ``--tokenizer``, else ``--model-path``'s (default: the embedded
    model's), through fastllm's own loaders so that a GGUF file works too."""
    model = args.model_path or (None if args.tokenizer else embedded_model_path())
    loader = registry.get("load_formats", resolve_load_format(model, "auto"))() if model else None
    return load_tokenizer(loader, model, args.tokenizer)


async def send_one(client: Any, args: argparse.Namespace, model: str, request: BenchRequest,
                   prompt_text: str) -> RequestResult:
    """Stream one request; chunks without text (usage, role) do not count as tokens arriving, except
    the last (a completion whose tokens all decode to no visible text still arrives, empty).

    The SSE lines are read with plain ``json.loads``, as vLLM's benchmark does with aiohttp: the
    OpenAI SDK's typed chunks cost the client more per token than the server spends, so with a
    few hundred streams it measured its own parsing, not the server."""
    result = RequestResult()
    chat = args.endpoint.endswith("chat/completions")
    body: dict[str, Any] = dict(model=model, max_tokens=request.output_len, temperature=0.0, stream=True,
                                stream_options={"include_usage": True})
    if args.ignore_eos:
        body["ignore_eos"] = True
    if chat:
        body["messages"] = [{"role": "user", "content": prompt_text}]
    else:
        body["prompt"] = request.prompt_token_ids
    start = last = time.perf_counter()
    try:
        async with client.stream("POST", args.endpoint, json=body) as response:
            if response.status_code != 200:
                await response.aread()
                raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(f"error event: {chunk['error'].get('message')}")
                if chunk.get("usage"):
                    result.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    result.output_tokens = chunk["usage"]["completion_tokens"]
                if not chunk.get("choices"):
                    continue
                choice = chunk["choices"][0]
                text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                if not text and not choice.get("finish_reason"):
                    continue
                now = time.perf_counter()
                if result.ttft == 0.0:
                    result.ttft = now - start
                else:
                    result.itl.append(now - last)
                last = now
        result.latency = time.perf_counter() - start
        result.ok = result.ttft > 0.0
        result.error = "" if result.ok else "no tokens received"
    except Exception as exc:  # one failed request is a data point, not the end of the run
        result.error = f"{type(exc).__name__}: {exc}"
    return result


async def run_load(args: argparse.Namespace, requests: list[BenchRequest],
                   prompts: list[str]) -> tuple[str, list[RequestResult], float]:
    """(model name used, one result per request in order, wall time of the whole run).

    No connection is reused, as vLLM's benchmark opens one per request: reusing an idle
    keep-alive connection races the server closing it (uvicorn closes after 5 idle seconds) and
    fails requests with "Connection error" that no server fault caused."""
    try:
        import httpx
    except ImportError:  # openai 3 depends on the httpx2 fork instead
        import httpx2 as httpx

    headers = {"Authorization": f"Bearer {args.api_key or 'EMPTY'}"}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=args.base_url.rstrip("/"), headers=headers, limits=limits,
                                 timeout=args.timeout) as client:
        if args.model:
            model = args.model
        else:
            listing = await client.get("/v1/models")
            listing.raise_for_status()
            model = listing.json()["data"][0]["id"]
        limit = asyncio.Semaphore(args.max_concurrency or len(requests))
        rng = random.Random(args.seed)

        async def limited(request: BenchRequest, prompt: str) -> RequestResult:
            async with limit:
                return await send_one(client, args, model, request, prompt)

        tasks = []
        start = time.perf_counter()
        for request, prompt in zip(requests, prompts):
            tasks.append(asyncio.ensure_future(limited(request, prompt)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    return model, results, duration


def build_requests(args: argparse.Namespace, tokenizer: Any) -> tuple[list[BenchRequest], list[str]]:
    if args.dataset_name == "sharegpt":
        if not args.dataset_path:
            raise SystemExit("--dataset-name sharegpt needs --dataset-path")
        requests = sharegpt_requests(args.dataset_path, args.num_prompts, tokenizer, args.max_model_len,
                                     args.sharegpt_output_len, args.seed)
    else:
        requests = random_requests(args.num_prompts, args.random_input_len, args.random_output_len,
                                   len(tokenizer), args.random_range_ratio, args.seed)
    return requests, [tokenizer.decode(r.prompt_token_ids) for r in requests]


def save_result(args: argparse.Namespace, model: str, summary: dict[str, Any], results: list[RequestResult]) -> str:
    record = {"date": datetime.now().strftime("%Y%m%d-%H%M%S"), "model": model, "endpoint": args.endpoint,
              "num_prompts": args.num_prompts, "request_rate": args.request_rate,
              "max_concurrency": args.max_concurrency, "metadata": dict(kv.split("=", 1) for kv in args.metadata),
              **summary, "requests": [asdict(r) for r in results]}
    name = args.result_filename or f"fastllm-serve-{args.request_rate}qps-{record['date']}.json"
    path = os.path.join(args.result_dir, name)
    os.makedirs(args.result_dir, exist_ok=True)
    with open(path, "w") as f:
        json.dump(record, f, indent=2)
    return path


def run(args: argparse.Namespace) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request would bury the table
    tokenizer = server_tokenizer(args)
    requests, prompts = build_requests(args, tokenizer)
    model, results, duration = asyncio.run(run_load(args, requests, prompts))
    summary = summarize(results, duration)
    print_summary("Serving Benchmark Result", summary)
    errors = sorted({r.error for r in results if r.error})
    if errors:
        print("errors seen:", *errors[:5], sep="\n  ")
    if args.save_result:
        print(f"results saved to {save_result(args, model, summary, results)}")
    return 0 if summary["completed"] else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("serve", help="load a running server (vLLM benchmark_serving style)")
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--endpoint", default="/v1/completions", choices=["/v1/completions", "/v1/chat/completions"])
    parser.add_argument("--model", default=None, help="served model name to ask for (default: the server's first)")
    parser.add_argument("--model-path", default=None, help="model whose tokenizer builds the prompts "
                                                           "(default: embedded SmolLM2)")
    parser.add_argument("--tokenizer", default=None, help="a Hugging Face tokenizer instead of --model-path's")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    parser.add_argument("--dataset-name", choices=["random", "sharegpt"], default="random")
    parser.add_argument("--dataset-path", default=None, help="ShareGPT-format JSON file")
    parser.add_argument("--num-prompts", type=int, default=100)
    parser.add_argument("--random-input-len", type=int, default=128)
    parser.add_argument("--random-output-len", type=int, default=32)
    parser.add_argument("--random-range-ratio", type=float, default=0.0)
    parser.add_argument("--sharegpt-output-len", type=int, default=None)
    parser.add_argument("--max-model-len", type=int, default=2048, help="skip ShareGPT pairs longer than this")
    parser.add_argument("--request-rate", type=float, default=float("inf"),
                        help="requests/s, Poisson arrivals; inf sends all at once")
    parser.add_argument("--max-concurrency", type=int, default=None)
    parser.add_argument("--ignore-eos", action="store_true")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save-result", action="store_true")
    parser.add_argument("--result-dir", default=".")
    parser.add_argument("--result-filename", default=None)
    parser.add_argument("--metadata", nargs="*", default=[], help="key=value pairs stored with the result")
    parser.set_defaults(func=run)
