"""/start_profile and /stop_profile: there only where the operator set FASTLLM_TORCH_PROFILER_DIR, behind
the API key like the OpenAI routes, and the trace holds the requests served in between."""

from __future__ import annotations

from fastllm.platforms.step_profiler import DIR_ENV
from tests.server.conftest import MODEL, start_server

BODY = {"model": MODEL, "prompt": "hi", "max_tokens": 2}


def test_profile_routes_exist_only_with_a_directory(engine, monkeypatch):
    monkeypatch.delenv(DIR_ENV, raising=False)
    running = start_server(engine)
    try:
        assert running.post("/start_profile").status_code == 404
    finally:
        running.stop()


def test_a_profile_of_served_requests_behind_the_key(engine, monkeypatch, tmp_path):
    monkeypatch.setenv(DIR_ENV, str(tmp_path))
    running = start_server(engine, api_keys=["secret"])
    key = {"Authorization": "Bearer secret"}
    try:
        assert running.post("/start_profile").status_code == 401
        assert running.post("/start_profile", headers=key).status_code == 200
        assert running.post("/v1/completions", json=BODY, headers=key).status_code == 200
        assert running.post("/stop_profile", headers=key).status_code == 200
    finally:
        running.post("/stop_profile", headers=key)
        running.stop()
    assert [path.name.endswith(".json.gz") for path in tmp_path.iterdir()] == [True]  # the one process's trace
