"""Property-based fuzz: no body sent to either POST route gets a 5xx, and no SamplingParams that
LLM.generate accepts can make the engine raise (a bad one is that request's 400)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastllm import LLM
from tests.conftest import TINY_LLAMA
from tests.server.conftest import MODEL, wait_idle

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])

TEXT = st.one_of(st.text(max_size=12), st.sampled_from(["", "\ud800", "a\udfffb", "{{ 'A' * 10**9 }}", "/etc/passwd"]))
INTEGERS = st.one_of(st.integers(-3, 300), st.sampled_from([2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30]))
SCALARS = st.one_of(st.none(), st.booleans(), INTEGERS, st.floats(allow_nan=True, allow_infinity=True), TEXT)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(TEXT, inner, max_size=3)), max_leaves=8)
MAX_TOKENS = st.sampled_from([1, 2, 0, -1, True, "2", 2.0, 2**70])
SAMPLING_FIELDS = ["n", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                   "repetition_penalty", "seed", "stop", "stop_token_ids", "logit_bias", "ignore_eos", "min_tokens",
                   "skip_special_tokens", "stream", "stream_options", "response_format", "guided_json",
                   "guided_regex", "guided_choice", "guided_grammar", "user", "model"]


def fields(extra: list[str]) -> st.SearchStrategy[dict]:
    return st.dictionaries(st.sampled_from(SAMPLING_FIELDS + extra), VALUES, max_size=4)


def assert_no_5xx(server, path: str, body: dict) -> None:
    response = server.post(path, data=json.dumps(body), headers={"content-type": "application/json"})
    assert response.status_code < 500, (body, response.text[:300])
    if response.status_code >= 400:
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


@FUZZ
@given(body=fields(["prompt", "echo", "logprobs", "best_of", "suffix"]), prompt=VALUES, max_tokens=MAX_TOKENS)
def test_completions_never_answer_5xx(server, body, prompt, max_tokens):
    assert_no_5xx(server, "/v1/completions", {"model": MODEL, "prompt": prompt, **body, "max_tokens": max_tokens})


@FUZZ
@given(body=fields(["logprobs", "top_logprobs", "tools", "tool_choice", "chat_template", "chat_template_kwargs"]),
       messages=st.one_of(VALUES, st.lists(st.fixed_dictionaries({"role": VALUES, "content": VALUES}), max_size=3)),
       max_tokens=MAX_TOKENS)
def test_chat_completions_never_answer_5xx(server, body, messages, max_tokens):
    assert_no_5xx(server, "/v1/chat/completions",
                  {"model": MODEL, "messages": messages, **body, "max_tokens": max_tokens})


def test_the_server_is_idle_after_the_fuzz(engine, server):
    wait_idle(engine)
    assert engine.dead_error is None and server.get("/health").status_code == 200


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
    return LLM(str(folder), load_format="dummy", max_model_len=64, block_size=16, num_gpu_blocks_override=16)


PARAM_VALUES = st.one_of(INTEGERS, st.floats(-5, 5), st.booleans(), st.lists(INTEGERS, max_size=3),
                         st.dictionaries(INTEGERS, st.floats(-200, 200), max_size=3), st.lists(TEXT, max_size=2))


@FUZZ
@given(params=st.dictionaries(st.sampled_from(SAMPLING_FIELDS[:14] + ["bad_words", "logprobs", "best_of"]),
                              PARAM_VALUES, max_size=5),
       prompt=st.lists(INTEGERS, min_size=0, max_size=6))
def test_sampling_params_fail_alone_or_run(tiny_llm, params, prompt):
    params = {**params, "max_tokens": 3}
    output = tiny_llm.generate([prompt, [5, 6, 7]], [params, {"max_tokens": 2}], use_tqdm=False)
    assert output[0].error_code in (200, 400), output[0].error_msg
    assert output[1].error_code == 200
    kv = tiny_llm.engine.kv_cache
    assert kv.num_free_blocks == kv.pool.num_usable_blocks and not tiny_llm.engine.requests
