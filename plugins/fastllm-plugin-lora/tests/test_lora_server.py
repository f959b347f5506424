"""``--lora-modules`` over HTTP: adapters listed and addressed by name with PEFT's output, an unknown
name a 404, a broken adapter a 400, runtime load/unload behind the API key, and the LoRA metrics."""

from __future__ import annotations

import openai
import pytest

from fastllm.config import EngineConfig
from fastllm.engine.async_llm import AsyncLLM
from tests.server.conftest import start_server

from lora_helpers import peft_greedy

KEY = "secret"
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def engine(smollm2_path):
    engine = AsyncLLM(EngineConfig(model=smollm2_path, enable_lora=True, max_loras=2, max_model_len=256,
                                   num_gpu_blocks_override=32, max_num_seqs=8))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def server(engine, adapter_paths, tmp_path_factory):
    broken = tmp_path_factory.mktemp("broken")
    (broken / "adapter_config.json").write_text("{}")  # no adapter_model.safetensors
    running = start_server(engine, lora_modules={"qv8": adapter_paths["qv8"], "broken": str(broken)},
                           api_keys=[KEY], allow_runtime_lora_updating=True)
    yield running
    running.stop()


def _completion(client, model: str) -> str:
    return client.completions.create(model=model, prompt=PROMPT, max_tokens=6, temperature=0).choices[0].text


def test_adapters_are_served_by_name(server, peft_model, hf_smollm2, adapter_paths):
    client, tokenizer = server.client(KEY), hf_smollm2[1]
    ids = tokenizer(PROMPT)["input_ids"]
    cards = {card.id: card for card in client.models.list().data}
    assert cards["qv8"].parent == "smol" and cards["qv8"].root == "qv8"  # never a path

    assert _completion(client, "qv8") == tokenizer.decode(peft_greedy(peft_model, "qv8", ids, 6))
    assert _completion(client, "smol") == tokenizer.decode(peft_greedy(peft_model, None, ids, 6))
    with pytest.raises(openai.NotFoundError):
        _completion(client, "no-such-adapter")
    with pytest.raises(openai.BadRequestError, match="adapter_model.safetensors not found"):
        _completion(client, "broken")

    metrics = server.get("/metrics").text
    assert 'fastllm:lora_requests_total{lora_name="qv8"} 1.0' in metrics
    assert "fastllm:lora_time_e2e_requests_count 1.0" in metrics


def test_runtime_load_and_unload(server, peft_model, hf_smollm2, adapter_paths, engine):
    client, tokenizer = server.client(KEY), hf_smollm2[1]
    body = {"lora_name": "mlp4", "lora_path": adapter_paths["mlp4"]}
    assert server.post("/v1/load_lora_adapter", json=body).status_code == 401  # no API key
    auth = {"Authorization": f"Bearer {KEY}"}
    assert server.post("/v1/load_lora_adapter", json=body, headers=auth).status_code == 200
    assert server.post("/v1/load_lora_adapter", json=body, headers=auth).status_code == 400  # name taken
    bad = server.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/nowhere"}, headers=auth)
    assert bad.status_code == 400 and "not found" in bad.text

    ids = tokenizer(PROMPT)["input_ids"]
    assert _completion(client, "mlp4") == tokenizer.decode(peft_greedy(peft_model, "mlp4", ids, 6))
    assert server.post("/v1/unload_lora_adapter", json={"lora_name": "mlp4"}, headers=auth).status_code == 200
    with pytest.raises(openai.NotFoundError):
        _completion(client, "mlp4")
    assert "mlp4" not in {card.id for card in client.models.list().data}

    closed = start_server(engine)  # runtime updating is off unless enabled
    try:
        assert closed.post("/v1/load_lora_adapter", json=body).status_code == 404
    finally:
        closed.stop()
