"""The OpenAI-compatible HTTP app over one AsyncLLM, and the uvicorn server that drains on SIGTERM.

``build_app`` does not own the engine: several apps (each with its own metrics
registry) may share one engine, and whoever made the engine shuts it down.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType
from typing import Callable, Optional

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

import fastllm
from fastllm.engine.async_llm import AsyncLLM
from fastllm.entrypoints.openai.errors import install_error_handlers
from fastllm.entrypoints.openai.http_protocol import header_timeout_protocol
from fastllm.entrypoints.openai.middleware import RequestGuard
from fastllm.entrypoints.openai.protocol import (LoadLoRAAdapterRequest, ModelCard, ModelList,
                                                 UnloadLoRAAdapterRequest)
from fastllm.entrypoints.openai.protocol_chat import ChatCompletionRequest
from fastllm.entrypoints.openai.protocol_completion import CompletionRequest
from fastllm.entrypoints.openai.server_config import ServerConfig
from fastllm.entrypoints.openai.serving_chat import ChatServing
from fastllm.entrypoints.openai.serving_completion import CompletionServing
from fastllm.entrypoints.openai.serving_context import ServingContext
from fastllm.metrics import EngineStatsCollector, ServingMetrics
from fastllm.platforms.step_profiler import DIR_ENV as PROFILER_DIR_ENV


def build_app(engine: AsyncLLM, config: ServerConfig) -> FastAPI:
    registry = CollectorRegistry()
    registry.register(EngineStatsCollector(lambda: engine.stats))
    ctx = ServingContext(engine, config, ServingMetrics(registry, engine.max_model_len))
    completions, chat = CompletionServing(ctx), ChatServing(ctx)

    # the API's schema and playground are not for whoever finds the port of a keyed server
    docs = not config.api_keys or config.enable_docs
    app = FastAPI(title="fastllm OpenAI-compatible server", version=fastllm.__version__,
                  docs_url="/docs" if docs else None, redoc_url="/redoc" if docs else None,
                  openapi_url="/openapi.json" if docs else None)
    app.state.serving = ctx
    install_error_handlers(app)
    app.add_middleware(RequestGuard, api_keys=config.api_keys, max_body_bytes=config.max_request_body_bytes,
                       body_timeout=config.body_timeout)

    @app.get("/health")
    async def health() -> Response:
        """200 while requests are welcome; 503 once draining or after the engine died (probes stop routing)."""
        healthy = engine.dead_error is None and not ctx.draining
        return Response(status_code=200 if healthy else 503)

    @app.get("/version")
    async def version() -> JSONResponse:
        return JSONResponse({"version": fastllm.__version__})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> ModelList:
        # root is the served name, not engine.config.model: where the weights lie is the operator's business
        base = [ModelCard(id=name, root=name, max_model_len=engine.max_model_len)
                for name in config.served_model_names]
        adapters = [ModelCard(id=name, root=name, parent=config.served_model_names[0],
                              max_model_len=engine.max_model_len) for name in ctx.adapters]
        return ModelList(data=base + adapters)

    if config.allow_runtime_lora_updating:
        @app.post("/v1/load_lora_adapter")
        async def load_lora_adapter(request: LoadLoRAAdapterRequest) -> Response:
            return Response(await ctx.load_adapter(request.lora_name, request.lora_path))

        @app.post("/v1/unload_lora_adapter")
        async def unload_lora_adapter(request: UnloadLoRAAdapterRequest) -> Response:
            return Response(await ctx.unload_adapter(request.lora_name))

    if os.environ.get(PROFILER_DIR_ENV):  # the operator's switch, as vLLM's: traces go to that directory
        @app.post("/start_profile")
        async def start_profile() -> Response:
            await engine.start_profile()
            return Response(status_code=200)

        @app.post("/stop_profile")
        async def stop_profile() -> Response:
            await engine.stop_profile()
            return Response(status_code=200)

    @app.post("/v1/completions")
    async def create_completion(request: CompletionRequest, raw: Request) -> Response:
        return await completions.create(request, raw)

    @app.post("/v1/chat/completions")
    async def create_chat_completion(request: ChatCompletionRequest, raw: Request) -> Response:
        return await chat.create(request, raw)

    return app


# seconds uvicorn waits past --shutdown-timeout before cancelling what is still open; by then the
# engine has ended every request, so this only catches a response that failed to notice
CANCEL_GRACE_SECONDS = 5.0


class DrainingServer(uvicorn.Server):
    """uvicorn, plus: from the first SIGTERM/SIGINT on, new requests get a 503 and ``on_drain`` runs once."""

    def __init__(self, config: uvicorn.Config, ctx: ServingContext,
                 on_drain: Optional[Callable[[], None]] = None):
        super().__init__(config)
        self.ctx = ctx
        self.on_drain = on_drain

    def handle_exit(self, sig: int, frame: Optional[FrameType]) -> None:
        if not self.ctx.draining and self.on_drain is not None:
            self.on_drain()
        self.ctx.draining = True
        super().handle_exit(sig, frame)


def uvicorn_config(app: FastAPI, host: str, port: int, log_level: str = "info") -> uvicorn.Config:
    """uvicorn with the server's connection limits: concurrency, keep-alive, header deadline."""
    config: ServerConfig = app.state.serving.config
    return uvicorn.Config(app, host=host, port=port, log_level=log_level,
                          timeout_graceful_shutdown=config.shutdown_timeout + CANCEL_GRACE_SECONDS,
                          limit_concurrency=config.limit_concurrency, timeout_keep_alive=config.timeout_keep_alive,
                          http=header_timeout_protocol(config.header_timeout))


def run_server(app: FastAPI, host: str, port: int, shutdown_timeout: float, log_level: str = "info") -> None:
    """Serve until SIGTERM/SIGINT, then give in-flight requests ``shutdown_timeout`` seconds and return.

    If the engine loop dies, the server stops too (the caller then exits non-zero).
    The signal also starts the engine's own shutdown beside uvicorn's: it lets running
    requests finish for ``shutdown_timeout`` seconds, then aborts the rest, so their
    clients get a last chunk with ``finish_reason: "abort"`` and a clean end instead of
    a dropped connection. uvicorn re-raises the signal it handled once it has stopped;
    ignoring both signals beforehand makes that harmless, so the caller can still shut
    the engine down and exit normally.
    """
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
    ctx: ServingContext = app.state.serving
    config = uvicorn_config(app, host, port, log_level)
    config.timeout_graceful_shutdown = shutdown_timeout + CANCEL_GRACE_SECONDS

    def drain_engine() -> None:
        threading.Thread(target=ctx.engine.shutdown, args=(shutdown_timeout,), name="fastllm-drain",
                         daemon=True).start()

    server = DrainingServer(config, ctx, drain_engine)
    ctx.engine.on_dead.append(lambda: setattr(server, "should_exit", True))  # exit; a supervisor restarts us
    server.run()
