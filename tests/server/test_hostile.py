"""A corpus of hostile requests, one server: each gets its 4xx in OpenAI's error shape (or a 200),
never a 5xx, and afterwards the server still serves with nothing left running.

The corpus is generated over every class of issue 24 (loose types, out-of-range numbers,
token ids outside the vocabulary, seeds the sampler cannot hold, stop strings, lone
surrogates, roles, chat templates that read files or exhaust memory or time, grammars
that accept nothing, logprobs under a grammar, sizes and caps, malformed bodies).
"""

from __future__ import annotations

import json
import logging
from typing import Any, Iterator, NamedTuple, Optional

from tests.server.conftest import MODEL, wait_idle

VOCAB = 49152  # SmolLM2
ERROR_KEYS = {"message", "type", "param", "code"}


class Case(NamedTuple):
    name: str
    path: str
    body: Any  # a dict sent as JSON, or bytes sent as they are
    status: int


def completion(name: str, status: int, **fields: Any) -> Case:
    return Case(name, "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2, **fields}, status)


def chat(name: str, status: int, **fields: Any) -> Case:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, **fields}
    return Case(name, "/v1/chat/completions", body, status)


def both(name: str, status: int, **fields: Any) -> list[Case]:
    return [completion(f"cmpl {name}", status, **fields), chat(f"chat {name}", status, **fields)]


NOT_INTS = [True, False, "3", 3.5, [1], {"a": 1}]
NOT_BOOLS = ["true", 1, 0, "yes", [True]]
INT_FIELDS = ["n", "max_tokens", "top_k", "seed", "min_tokens"]
BOOL_FIELDS = ["stream", "ignore_eos", "skip_special_tokens", "include_stop_str_in_output"]
OUT_OF_RANGE = {"max_tokens": [0, -1, 10**9, 2**31, 2**70], "n": [0, -1, 129, 2**63],
                "seed": [2**63, 2**64, 2**70, -(2**63) - 1], "temperature": [-0.1, 2.5, 1e308],
                "top_p": [0.0, -1.0, 1.5], "top_k": [-2], "min_p": [-0.5, 2.0], "presence_penalty": [2.5, -3.0],
                "frequency_penalty": [9.0], "repetition_penalty": [0.0, -1.0, 11.0], "min_tokens": [-1]}
BAD_TOKEN_IDS = [-1, -100000, VOCAB, 10**9, 2**63, 2**64]
SURROGATES = ["\ud800", "a\udfffb", "\udbff\udc00\ud800"]
NESTED = 100_000


def type_cases() -> Iterator[Case]:
    for field in INT_FIELDS:
        for value in NOT_INTS:
            yield from both(f"{field}={value!r}", 400, **{field: value})
    for field in BOOL_FIELDS:
        for value in NOT_BOOLS:
            yield completion(f"{field}={value!r}", 400, **{field: value})
    yield completion("echo='true'", 400, echo="true")
    yield completion("logprobs=True", 400, logprobs=True)
    yield chat("logprobs='yes'", 400, logprobs="yes")
    yield chat("top_logprobs=True", 400, logprobs=True, top_logprobs=True)
    for prompt in ([True, False], [1.5, 2.5], ["a", 1], [[1, True]], [None], {"a": 1}, 5, None):
        yield completion(f"prompt={prompt!r}", 400, prompt=prompt)


def range_cases() -> Iterator[Case]:
    for field, values in OUT_OF_RANGE.items():
        for value in values:
            yield from both(f"{field}={value!r}", 400, **{field: value})
    yield completion("best_of<n", 400, n=3, best_of=2)
    yield completion("logprobs=6", 400, logprobs=6)
    yield chat("top_logprobs=21", 400, logprobs=True, top_logprobs=21)
    yield completion("min_tokens>max_tokens", 400, min_tokens=5, max_tokens=2)
    yield completion("seed at the int64 edge", 200, seed=2**63 - 1, temperature=0.7)
    yield completion("seed edge with n=2", 400, seed=2**63 - 1, n=2, temperature=0.7)
    yield completion("negative seed", 200, seed=-5, temperature=0.7)
    yield completion("max_tokens past max_model_len", 400, prompt="hello " * 300, max_tokens=300)


def token_id_cases() -> Iterator[Case]:
    for token in BAD_TOKEN_IDS:
        yield completion(f"prompt token {token}", 400, prompt=[1, token])
        yield completion(f"nested prompt token {token}", 400, prompt=[[1, 2], [token]])
        yield from both(f"stop_token_ids {token}", 400, stop_token_ids=[token], min_tokens=2)
        yield from both(f"logit_bias key {token}", 400, logit_bias={str(token): 1.0})
    for key in ("abc", "1.5", "", " 5", "\u0665"):
        yield completion(f"logit_bias key {key!r}", 400, logit_bias={key: 1.0})
    yield completion("logit_bias value 'x'", 400, logit_bias={"5": "x"})
    yield completion("logit_bias value 200", 400, logit_bias={"5": 200})
    yield completion("too many logit_bias entries", 400, logit_bias={str(i): 1.0 for i in range(5000)})
    yield completion("valid logit_bias", 200, logit_bias={"5": -100, "6": 100})
    yield completion("empty prompt list", 400, prompt=[])
    yield completion("empty nested prompt", 400, prompt=[[]])


def stop_cases() -> Iterator[Case]:
    for stop in ([""], "", ["a", ""], ["x"] * 65, "x" * 1025, ["y" * 5000], [1], [None], 5):
        yield from both(f"stop={str(stop)[:20]!r}", 400, stop=stop)
    yield from both("stop ok", 200, stop=[".", "\n"])
    yield completion("stop_token_ids too many", 400, stop_token_ids=[5] * 5000)


def unicode_cases() -> Iterator[Case]:
    for text in SURROGATES:
        yield completion(f"prompt {text!r}", 400, prompt=text)
        yield completion(f"prompt list {text!r}", 400, prompt=["ok", text])
        yield from both(f"model {text!r}", 400, model=text)
        yield from both(f"stop {text!r}", 400, stop=[text])
        yield completion(f"user {text!r}", 400, user=text)
        yield chat(f"content {text!r}", 400, messages=[{"role": "user", "content": text}])
        yield chat(f"name {text!r}", 400, messages=[{"role": "user", "content": "hi", "name": text}])
        yield completion(f"logit_bias key {text!r}", 400, logit_bias={text: 1})
    yield completion("astral text is fine", 200, prompt="\U0001F600 and \u00e9")


def chat_cases() -> Iterator[Case]:
    for role in ("wizard", "", "USER", None, 5, ["user"]):
        yield chat(f"role {role!r}", 400, messages=[{"role": role, "content": "hi"}])
    yield chat("no role", 400, messages=[{"content": "hi"}])
    yield chat("no messages", 400, messages=[])
    yield chat("messages not a list", 400, messages={"role": "user", "content": "hi"})
    yield chat("content a number", 400, messages=[{"role": "user", "content": 5}])
    yield chat("image part", 400, messages=[{"role": "user", "content": [{"type": "image_url"}]}])
    yield chat("tool_choice without tools", 400, tool_choice="required")
    yield chat("reserved template kwarg", 400, chat_template_kwargs={"tools": []})
    yield chat("template kwargs not a dict", 400, chat_template_kwargs=[1])
    for template in ("{{ 'A' * 1000000000 }}", "{{ 'A' * 20000000 }}", "{{ 'A' * 10**12 }}",
                     "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                     "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
                     "{% endfor %}{{ ns.s }}",
                     "{{ 'x' | center(1000000000) }}", "{% if %}", "{{ raise_exception('no') }}",
                     "{% include '/etc/passwd' %}", "{% extends '/etc/passwd' %}", "{% import '/etc/hosts' as h %}",
                     "{{ cycler.__init__.__globals__ }}"):
        yield chat(f"template {template[:40]!r}", 400, chat_template=template)
    yield chat("template reaching for internals renders nothing", 200,
               chat_template="{{ ''.__class__ }}{{ messages[0].content }}")


def stream_option_cases() -> Iterator[Case]:
    yield from both("stream_options without stream", 400, stream_options={"include_usage": True})
    yield from both("stream_options with stream=false", 400, stream=False, stream_options={"include_usage": True})
    yield from both("stream_options not a dict", 400, stream=True, stream_options=True)
    yield from both("stream_options ok", 200, stream=True, stream_options={"include_usage": True})


RECURSIVE_SCHEMA = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}


def guided_cases() -> Iterator[Case]:
    yield from both("grammar that accepts nothing", 400, guided_grammar="root ::= a\na ::= a")
    yield from both("schema that accepts nothing", 400, guided_json=RECURSIVE_SCHEMA)
    yield from both("bad regex", 400, guided_regex="(")
    yield from both("bad grammar", 400, guided_grammar="root ::= \"a\" (")
    yield from both("schema not JSON", 400, guided_json="{not json")
    yield from both("two guides", 400, guided_regex="a", guided_choice=["a"])
    yield from both("empty choice", 400, guided_choice=[])
    yield completion("grammar with logprobs", 200, guided_choice=["yes", "no"], logprobs=5, max_tokens=3)
    yield completion("schema with logprobs and echo", 200, guided_json={"type": "object"}, logprobs=2, echo=True)
    yield chat("json_object with logprobs", 200, response_format={"type": "json_object"}, logprobs=True,
               top_logprobs=5)
    yield chat("response_format unknown", 400, response_format={"type": "yaml"})


def cap_cases() -> Iterator[Case]:
    yield completion("200 prompts x n=128", 400, prompt=["a"] * 200, n=128)
    yield completion("5000 prompts", 400, prompt=["a"] * 5000)
    yield completion("100 prompts x best_of 64", 400, prompt=["a"] * 100, n=1, best_of=64)
    yield completion("prompt far past max_model_len", 400, prompt="a " * 200_000)
    yield completion("token prompt past max_model_len", 400, prompt=[5] * 600)
    yield chat("messages far past max_model_len", 400, messages=[{"role": "user", "content": "a" * 2_000_000}])
    yield completion("suffix", 400, suffix="x")
    yield completion("best_of streamed", 400, n=1, best_of=2, stream=True)


def protocol_cases() -> Iterator[Case]:
    for path in ("/v1/completions", "/v1/chat/completions"):
        for raw in (b"{", b"[]", b"null", b"1", b'"x"', b"\xff\xfe", b"[" * NESTED + b"]" * NESTED,
                    b'{"a":' * 5000 + b"1" + b"}" * 5000, b""):
            yield Case(f"{path} raw {raw[:8]!r}", path, raw, 400)
    yield completion("unknown model", 404, model="no-such-model")
    yield Case("unknown route", "/v1/nothing", {}, 404)


def corpus() -> list[Case]:
    cases = [*type_cases(), *range_cases(), *token_id_cases(), *stop_cases(), *unicode_cases(), *chat_cases(),
             *stream_option_cases(), *guided_cases(), *cap_cases(), *protocol_cases()]
    names = [case.name + case.path for case in cases]
    assert len(set(names)) == len(names), "corpus names must be unique"
    return cases


def send(server, case: Case):
    if isinstance(case.body, bytes):
        return server.post(case.path, data=case.body, headers={"content-type": "application/json"})
    return server.post(case.path, json=case.body)


def check(case: Case, response) -> Optional[str]:
    """None if the answer is right, else what is wrong."""
    if response.status_code != case.status:
        return f"{case.name}: {response.status_code} instead of {case.status}: {response.text[:300]}"
    if case.status >= 400:
        error = response.json().get("error")
        if not isinstance(error, dict) or set(error) != ERROR_KEYS or not error["message"]:
            return f"{case.name}: not an OpenAI error body: {response.text[:300]}"
    elif "data: " in response.text[:10] and '"error"' in response.text:
        return f"{case.name}: stream carried an error: {response.text[:300]}"
    return None


def test_the_corpus_is_large_and_covers_every_class():
    cases = corpus()
    assert len(cases) >= 150
    assert {200, 400, 404} <= {case.status for case in cases}


def test_hostile_requests_get_4xx_never_5xx(engine, server, caplog):
    caplog.set_level(logging.INFO)
    problems = [problem for case in corpus() if (problem := check(case, send(server, case)))]
    assert not problems, "\n".join(problems)
    wait_idle(engine)
    assert server.get("/health").status_code == 200
    answer = server.post("/v1/completions", json={"model": MODEL, "prompt": "The capital of France is",
                                                  "max_tokens": 2, "temperature": 0})
    assert answer.ok and answer.json()["choices"][0]["text"].startswith(" Paris")
    wait_idle(engine)
    assert server.metric("fastllm:num_requests_running") == 0
    assert server.metric("fastllm:num_requests_waiting") == 0
    assert server.metric("fastllm:kv_cache_usage_perc") == 0
    assert engine.admission.num_held == 0 and engine.dead_error is None
    assert "Traceback" not in caplog.text


def test_masked_logprobs_are_finite(server):
    body = {"model": MODEL, "prompt": "Answer:", "max_tokens": 3, "guided_choice": ["yes", "no"], "logprobs": 5}
    logprobs = server.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]
    values = [lp for top in logprobs["top_logprobs"] for lp in top.values()] + logprobs["token_logprobs"]
    assert values and all(-9999.0 <= lp <= 0.0 for lp in values)
    assert -9999.0 in values  # five alternatives, at most two of them allowed by the grammar


def test_a_grammar_that_leads_into_a_dead_end_ends_the_request(server):
    body = {"model": MODEL, "prompt": "Say x:", "max_tokens": 20, "guided_grammar": 'root ::= "x" a\na ::= a',
            "logprobs": 1, "ignore_eos": True}
    answer = server.post("/v1/completions", json=body)
    assert answer.ok, answer.text
    choice = answer.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and answer.json()["usage"]["completion_tokens"] <= 2
    assert all(lp >= -9999.0 for lp in choice["logprobs"]["token_logprobs"])


def test_models_do_not_show_the_model_path(engine, server):
    text = server.get("/v1/models").text
    assert engine.config.model not in text and json.loads(text)["data"][0]["root"] == MODEL
