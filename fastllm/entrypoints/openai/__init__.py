"""The OpenAI-compatible server: ``api_server.build_app(AsyncLLM, ServerConfig)`` and ``run_server``.

Nothing is imported here, so the CLI and its config load without FastAPI installed.
"""
