"""/metrics: every series of the monitoring table, and counters that match what the clients were told."""

from __future__ import annotations

import openai
import pytest

from tests.server.conftest import MODEL, start_server, wait_idle

# the monitoring table of the AIAK server docs, verbatim (its "指标定义" column)
AIAK_TABLE = ["vllm:request_total", "vllm:e2e_request_latency_seconds", "vllm:request_process_success_total",
              "vllm:inference_compute_infer_duration", "vllm:request_process_fail_total",
              "vllm:time_to_first_token_seconds", "vllm:time_per_output_token_seconds", "vllm:request_prompt_tokens",
              "vllm:request_generation_tokens", "vllm:request_params_n", "vllm:num_preemptions_total",
              "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
              "vllm:lora_count", "vllm:lora_time_e2e_requests"]
ENGINE_GAUGES = ["fastllm:num_requests_running", "fastllm:num_requests_waiting", "fastllm:kv_cache_usage_perc"]
SPECULATIVE = ["fastllm:spec_decode_num_draft_tokens_total", "fastllm:spec_decode_num_accepted_tokens_total"]
TABLE = [name.replace("vllm:", "fastllm:") for name in AIAK_TABLE] + ENGINE_GAUGES + SPECULATIVE


@pytest.fixture()
def fresh(engine):
    """A server of its own, so its counters start at zero."""
    running = start_server(engine)
    yield running
    running.stop()


def test_every_table_metric_is_exported(server):
    series = {line.split("{")[0].split(" ")[0] for line in server.get("/metrics").text.splitlines()
              if line and not line.startswith("#")}
    assert not [name for name in TABLE if name not in series and f"{name}_count" not in series]


def test_counters_match_the_responses(engine, fresh):
    client = fresh.client()
    one = client.completions.create(model=MODEL, prompt="Hello there", max_tokens=3, n=2, temperature=0.5)
    two = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    chunks = list(client.completions.create(model=MODEL, prompt="Count: 1, 2,", max_tokens=5, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="x", max_tokens=1)
    wait_idle(engine)
    usages = [one.usage, two.usage, chunks[-1].usage]

    assert fresh.metric("fastllm:request_total") == 4
    assert fresh.metric("fastllm:request_process_success_total") == 3
    assert fresh.metric("fastllm:request_process_fail_total") == 1
    assert fresh.metric("fastllm:prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert fresh.metric("fastllm:generation_tokens_total") == sum(u.completion_tokens for u in usages)
    assert fresh.metric("fastllm:time_to_first_token_seconds_count") == 3
    assert fresh.metric("fastllm:request_params_n_sum") == 2 + 1 + 1
    assert fresh.metric("fastllm:e2e_request_latency_seconds_sum") > 0
    assert fresh.metric("fastllm:num_requests_running") == 0
