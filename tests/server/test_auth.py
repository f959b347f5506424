"""--api-keys: the OpenAI routes need a key, checked before the server does any work; probes stay open."""

from __future__ import annotations

import openai
import pytest

from tests.server.conftest import MODEL, start_server

KEYS = ["key-one", "key-two"]
BODY = {"model": MODEL, "prompt": "hi", "max_tokens": 1}


@pytest.fixture(scope="module")
def secured(engine):
    running = start_server(engine, api_keys=KEYS)
    yield running
    running.stop()


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "key-one"},
                                     {"Authorization": "Basic key-one"}])
def test_missing_or_wrong_key_is_401_before_any_work(secured, headers):
    for path in ("/v1/completions", "/v1/chat/completions"):
        response = secured.post(path, json=BODY, headers=headers)
        assert response.status_code == 401
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    garbage = secured.post("/v1/completions", data=b"x" * 100, headers=headers)
    assert garbage.status_code == 401  # the body was never parsed
    assert secured.get("/v1/models", headers=headers).status_code == 401
    assert secured.metric("fastllm:request_total") == 0.0


def test_official_client_with_wrong_key(secured):
    with pytest.raises(openai.AuthenticationError):
        secured.client(api_key="wrong").completions.create(**BODY)


@pytest.mark.parametrize("key", KEYS)
def test_every_configured_key_works(secured, key):
    client = secured.client(api_key=key)
    assert client.completions.create(**BODY).usage.completion_tokens == 1
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_probes_need_no_key(secured):
    for path in ("/health", "/version", "/metrics"):
        assert secured.get(path).status_code == 200
