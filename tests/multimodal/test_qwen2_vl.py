"""Qwen2-VL and Qwen2.5-VL on tiny random checkpoints: greedy output equal to HF transformers
with images of different sizes, a video, chunked prefill that cuts an image, and prefix caching."""

from __future__ import annotations

import pytest
from PIL import Image

from fastllm import LLM, SamplingParams
from tests.multimodal.tiny_vl import (IMAGE, VIDEO, build_checkpoint, check_prefix_cache_keys_blocks_by_image,
                                      hf_greedy_mm, image)

GREEDY = SamplingParams(max_tokens=6, temperature=0.0)


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def checkpoint(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp(request.param))
    model, tokenizer = build_checkpoint(path, request.param)
    return path, model, tokenizer


def hf_reference(llm: LLM, hf, tokenizer, prompt: str, media: dict) -> list[int]:
    """HF's greedy tokens on the same expanded prompt and processor output."""
    loaded = {k: [Image.fromarray(v) for v in vs] if k == "image" else vs for k, vs in media.items()}
    ids, mm = llm.engine.multimodal.process(tokenizer(prompt)["input_ids"], loaded)
    return hf_greedy_mm(hf, ids, list(mm.items), GREEDY.max_tokens)


def test_greedy_matches_hf(checkpoint):
    path, hf, tokenizer = checkpoint
    video = image(56, 84, 7)[None].repeat(4, axis=0)
    video[2:] = image(56, 84, 8)
    requests = [
        ("Look: " + IMAGE + " what is it?", {"image": [image(60, 40, 0)]}),
        (IMAGE + " and " + IMAGE + " differ how?", {"image": [image(30, 90, 1), image(112, 84, 2)]}),
        ("A clip " + VIDEO + " summary:", {"video": [video]}),
    ]
    # one step at most 24 tokens: every prefill is chunked, some chunks end inside a placeholder run
    llm = LLM(path, max_model_len=512, num_gpu_blocks_override=64, block_size=16, max_num_batched_tokens=24)
    outs = llm.generate([{"prompt": p, "multimodal_data": m} for p, m in requests] + ["plain text"], GREEDY,
                        use_tqdm=False)
    for (prompt, media), out in zip(requests, outs):
        assert out.error_code == 200, out.error_msg
        assert out.outputs.token_ids == hf_reference(llm, hf, tokenizer, prompt, media)
    assert outs[-1].outputs.token_ids == hf_greedy_mm(hf, tokenizer("plain text")["input_ids"], [], 6)


def test_prefix_cache_keys_blocks_by_image(checkpoint):
    path, hf, tokenizer = checkpoint
    prompt = "Here is the first picture of a long list " + IMAGE + " tell me"
    check_prefix_cache_keys_blocks_by_image(
        path, tokenizer, prompt, image(84, 84, 3), image(84, 84, 4),
        lambda llm, second: hf_reference(llm, hf, tokenizer, prompt, {"image": [second]}))


def test_bundled_config_builds_the_published_size():
    import torch

    from fastllm import registry
    from fastllm.model_loader.dummy_loader import DummyLoader

    config = DummyLoader().load_config("qwen2.5-vl-7b")
    with torch.device("meta"):
        model = registry.get("models", config.architectures[0])(config)
    assert sum(p.numel() for p in model.parameters()) / 1e9 == pytest.approx(8.29, abs=0.005)
