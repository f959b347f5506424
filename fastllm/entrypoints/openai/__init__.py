"""The OpenAI-compatible server: ``build_app(AsyncLLM, ServerConfig)`` and ``run_server``."""

from fastllm.entrypoints.openai.api_server import build_app, run_server
from fastllm.entrypoints.openai.server_config import ServerConfig

__all__ = ["ServerConfig", "build_app", "run_server"]
