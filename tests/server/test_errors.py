"""Bad requests get OpenAI error bodies with the right status, and the server keeps serving."""

from __future__ import annotations

import openai
import pytest

from tests.server.conftest import MODEL, start_server

ERROR_KEYS = {"message", "type", "param", "code"}


def assert_error(response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == ERROR_KEYS and error["message"]
    return error


def test_malformed_json_is_400(server):
    response = server.post("/v1/completions", data=b'{"model": "smol", "prompt": ',
                           headers={"content-type": "application/json"})
    assert_error(response, 400)


def test_missing_field_is_400_not_422(server):
    error = assert_error(server.post("/v1/completions", json={"model": MODEL}), 400)
    assert error["param"] == "prompt"


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=1)


def test_unknown_route_is_404(server):
    assert_error(server.get("/v1/nothing-here"), 404)


def test_prompt_over_max_model_len_is_400(client):
    with pytest.raises(openai.BadRequestError, match="max_model_len"):
        client.completions.create(model=MODEL, prompt="hello " * 600, max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="max_model_len"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello " * 600}],
                                       max_tokens=1, stream=True)


@pytest.mark.parametrize("field, value", [("temperature", 5.0), ("top_p", 0.0), ("n", 0), ("logprobs", 6),
                                          ("max_tokens", 0), ("presence_penalty", 3.0), ("best_of", 0),
                                          ("logit_bias", {"5": 200})])
def test_out_of_range_values_are_400(client, field, value):
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="hi", **{"max_tokens": 1, field: value})


HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("body", [{"messages": []}, {"messages": HI, "top_logprobs": 2},
                                  {"messages": HI, "tool_choice": "required"},
                                  {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}])
def test_bad_chat_requests_are_400(server, body):
    assert_error(server.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 1, **body}), 400)


def test_oversized_body_is_413(engine):
    small = start_server(engine, max_request_body_bytes=2000)
    try:
        big = {"model": MODEL, "prompt": "x" * 5000, "max_tokens": 1}
        assert_error(small.post("/v1/completions", json=big), 413)
        chunked = (part for part in (b'{"model": "smol", "prompt": "', b"y" * 5000, b'"}'))
        assert_error(small.post("/v1/completions", data=chunked, headers={"content-type": "application/json"}), 413)
        assert small.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1}).ok
    finally:
        small.stop()


@pytest.mark.parametrize("path, body", [("/v1/completions", {"prompt": "hi"}),
                                        ("/v1/chat/completions", {"messages": HI})])
def test_internal_error_is_500_without_details_and_the_server_goes_on(engine, server, monkeypatch, path, body):
    def broken(*args, **kwargs):
        raise RuntimeError("secret internals")

    failed_before = server.metric("fastllm:request_process_fail_total")
    monkeypatch.setattr(engine.engine, "add_request", broken)
    error = assert_error(server.post(path, json={"model": MODEL, "max_tokens": 1, **body}), 500)
    monkeypatch.undo()
    assert error["type"] == "internal_server_error" and "secret" not in error["message"]
    assert server.metric("fastllm:request_process_fail_total") == failed_before + 1
    assert server.post(path, json={"model": MODEL, "max_tokens": 1, **body}).ok


def test_server_still_serves_after_errors(client):
    response = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=2, temperature=0)
    assert response.choices[0].text.startswith(" Paris")
