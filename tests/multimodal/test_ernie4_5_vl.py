"""ERNIE-4.5-VL on a tiny random checkpoint: greedy output equal to HF transformers with one and
two images of different sizes, chunked prefill that cuts an image, prefix caching, and the
thinking chat template through reasoning_parser="ernie-45-vl"."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch
from PIL import Image

from fastllm import LLM, SamplingParams
from fastllm.model_loader.gguf_loader import GGUFLoader
from fastllm.model_loader.resolve import embedded_model_path
from fastllm.multimodal.ernie4_5_vl import stamp_frame, timestamp_text
from fastllm.multimodal.media import MAX_VIDEO_FRAMES, load_video
from tests.multimodal.tiny_vl import check_prefix_cache_keys_blocks_by_image, data_url, image

GREEDY = SamplingParams(max_tokens=6, temperature=0.0)
VISION_TOKENS = ["<|IMAGE_START|>", "<|IMAGE_END|>", "<|image@placeholder|>",
                 "<|VIDEO_START|>", "<|VIDEO_END|>", "<|video@placeholder|>"]
IMAGE = "<|IMAGE_START|><|image@placeholder|><|IMAGE_END|>"
VIDEO = "<|VIDEO_START|><|video@placeholder|><|VIDEO_END|>"
# ERNIE-4.5-VL's chat template, shortened: numbered pictures, and a thought opened for the answer
CHAT_TEMPLATE = (
    "{% set pictures = namespace(n=0) %}{% for message in messages %}"
    "{% if message['role'] == 'user' %}User: {% else %}Assistant: {% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{% set pictures.n = pictures.n + 1 %}Picture {{ pictures.n }}:" + IMAGE +
    "{% elif part['type'] == 'video' %}Video:" + VIDEO +
    "{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant: {% if enable_thinking is defined and not enable_thinking %}"
    "<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A random three-layer checkpoint (one dense layer, two with text and vision experts)."""
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.ernie4_5_vl_moe.image_processing_pil_ernie4_5_vl_moe import (
        Ernie4_5_VLMoeImageProcessorPil,
    )

    path = str(tmp_path_factory.mktemp("ernie4_5_vl"))
    tokenizer = GGUFLoader().load_tokenizer(embedded_model_path(), None)
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    tokenizer.chat_template = CHAT_TEMPLATE
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    config = AutoConfig.for_model(
        "ernie4_5_vl_moe",
        text_config=dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, moe_intermediate_size=[32, 16], moe_k=2,
                         moe_num_experts=4, moe_num_shared_experts=1, max_position_embeddings=1024,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                         rope_parameters={"rope_type": "default", "rope_theta": 500000.0, "mrope_section": [3, 3, 2]}),
        vision_config=dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=64),
        image_token_id=ids["<|image@placeholder|>"], image_start_token_id=ids["<|IMAGE_START|>"],
        image_end_token_id=ids["<|IMAGE_END|>"], video_token_id=ids["<|video@placeholder|>"],
        video_start_token_id=ids["<|VIDEO_START|>"], video_end_token_id=ids["<|VIDEO_END|>"])
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32).eval()
    for name, param in model.named_parameters():  # larger than HF's init, so positions and routing matter
        if "e_score_correction_bias" in name or "norm" in name or ".ln." in name:
            param.data.normal_(1.0 if "bias" not in name else 0.0, 0.1)
        elif param.dim() > 1:
            param.data.normal_(0.0, 0.15)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    small_images = {"shortest_edge": 28 * 28 * 4, "longest_edge": 28 * 28 * 16}
    Ernie4_5_VLMoeImageProcessorPil(size=small_images).save_pretrained(path)
    return path, model, tokenizer


def hf_greedy(model, token_ids: list[int], items: list, max_new_tokens: int) -> list[int]:
    """HF's greedy continuation of an expanded prompt with the images and videos fastllm's processor made."""
    config = model.config
    kinds = {config.image_token_id: 1, config.video_token_id: 2}
    markers = {**kinds, config.image_start_token_id: 1, config.image_end_token_id: 1,
               config.video_start_token_id: 2, config.video_end_token_id: 2}
    kwargs = {"mm_token_type_ids": torch.tensor([[kinds.get(t, 0) for t in token_ids]]),
              "moe_mm_token_type_ids": torch.tensor([[markers.get(t, 0) for t in token_ids]])}
    for modality, pixels, grid in (("image", "pixel_values", "image_grid_thw"),
                                   ("video", "pixel_values_videos", "video_grid_thw")):
        chosen = [i for i in items if i.modality == modality]
        if chosen:
            kwargs[pixels] = torch.cat([i.pixel_values for i in chosen])
            kwargs[grid] = torch.tensor([i.grid_thw for i in chosen])
    with torch.inference_mode():
        out = model.generate(torch.tensor([token_ids]), max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=0, **kwargs)
    return out[0, len(token_ids):].tolist()


def hf_reference(llm: LLM, hf, token_ids: list[int], images: list, max_new_tokens: int = GREEDY.max_tokens,
                 videos: list = ()):
    media = {"image": [Image.fromarray(i) for i in images], "video": list(videos)}
    ids, mm = llm.engine.multimodal.process(token_ids, media)
    return hf_greedy(hf, ids, list(mm.items), max_new_tokens)


def test_greedy_matches_hf(checkpoint):
    path, hf, tokenizer = checkpoint
    requests = [
        ("Look: " + IMAGE + " what is it?", [image(112, 84, 0)]),
        (IMAGE + " and " + IMAGE + " differ how?", [image(30, 90, 1), image(112, 112, 2)]),
    ]
    # at most 16 tokens a step: every prefill is chunked, some chunks end inside a placeholder run
    llm = LLM(path, max_model_len=512, num_gpu_blocks_override=64, block_size=16, max_num_batched_tokens=16)
    outs = llm.generate([{"prompt": p, "multimodal_data": {"image": m}} for p, m in requests] + ["plain text"],
                        GREEDY, use_tqdm=False)
    for (prompt, images), out in zip(requests, outs):
        assert out.error_code == 200, out.error_msg
        assert out.outputs.token_ids == hf_reference(llm, hf, tokenizer(prompt)["input_ids"], images)
    assert outs[-1].outputs.token_ids == hf_greedy(hf, tokenizer("plain text")["input_ids"], [], 6)


@pytest.mark.parametrize("thinking", [True, False])
def test_chat_thinking_template_and_reasoning_parser(checkpoint, thinking):
    path, hf, tokenizer = checkpoint
    llm = LLM(path, max_model_len=512, num_gpu_blocks_override=64, block_size=16, reasoning_parser="ernie-45-vl")
    pixels = image(84, 56, 5)
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(pixels)}},
                                             {"type": "text", "text": "What is in the picture?"}]}]
    out = llm.chat(messages, GREEDY, use_tqdm=False, chat_template_kwargs={"enable_thinking": thinking})[0]
    assert out.error_code == 200, out.error_msg
    assert out.prompt.endswith("<think>\n" if thinking else "</think>\n\n")
    expected = hf_reference(llm, hf, tokenizer(out.prompt, add_special_tokens=False)["input_ids"], [pixels])
    assert out.outputs.token_ids == expected
    text = tokenizer.decode(expected, skip_special_tokens=True)
    assert "</think>" not in text  # a random model never closes its thought: all of it is reasoning
    assert (out.outputs.reasoning_content, out.outputs.text) == ((text, "") if thinking else ("", text))


def test_bundled_config_builds_the_published_size():
    """The bundled 28B-A3B config builds as many parameters as transformers' model of it."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForImageTextToText

    from fastllm import registry
    from fastllm.model_loader.dummy_loader import DummyLoader

    config = DummyLoader().load_config("ernie-4.5-vl-28b-a3b")
    model_cls = registry.get("models", config.architectures[0])  # loads the plugins off the meta device
    with torch.device("meta"):
        model = model_cls(config)
    with init_empty_weights():
        hf = AutoModelForImageTextToText.from_config(config)
    hf.tie_weights()  # from_config on empty weights leaves the LM head untied
    count = sum(p.numel() for p in model.parameters())
    assert count == sum(p.numel() for p in hf.parameters())
    assert count / 1e9 == pytest.approx(29.4, abs=0.05)


def clip(frames: int, width: int, height: int, seed: int) -> np.ndarray:
    return np.stack([image(width, height, seed + i) for i in range(frames)])


def gif_data_url(frames: np.ndarray) -> str:
    buffer = io.BytesIO()
    first, *rest = [Image.fromarray(f) for f in frames]
    first.save(buffer, format="GIF", save_all=True, append_images=rest, duration=500, loop=0)
    return "data:image/gif;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_timestamp_drawn_on_frame_corner():
    assert timestamp_text(3725.5) == "time: 01:02:05.50"
    frame = np.full((120, 160, 3), 128, dtype=np.uint8)
    stamped = stamp_frame(frame, 1.5, None)
    corner = stamped[:12, :80]
    assert (corner == 0).all(-1).any() and (corner == 255).all(-1).any()  # black text, white outline
    assert (stamped[40:] == 128).all()  # nothing below the text line


def test_video_matches_hf(checkpoint):
    """A three-frame video (padded to four, two placeholder steps) beside an image, offline and as a
    chat ``video_url`` part; a video past the frame limit fails its request only."""
    path, hf, tokenizer = checkpoint
    llm = LLM(path, max_model_len=512, num_gpu_blocks_override=64, block_size=16, max_num_batched_tokens=32)
    prompt = "clip " + VIDEO + " and " + IMAGE + " what?"
    video, picture = clip(3, 84, 56, 10), image(56, 56, 20)
    too_long = np.zeros((MAX_VIDEO_FRAMES + 1, 28, 28, 3), dtype=np.uint8)
    outs = llm.generate([{"prompt": prompt, "multimodal_data": {"video": [video], "image": [picture]}},
                         {"prompt": "clip " + VIDEO, "multimodal_data": {"video": [too_long]}}],
                        GREEDY, use_tqdm=False)
    assert outs[0].error_code == 200, outs[0].error_msg
    ids, mm = llm.engine.multimodal.process(tokenizer(prompt)["input_ids"],
                                            {"video": [video], "image": [Image.fromarray(picture)]})
    grid = mm.items[0].grid_thw
    assert grid[0] == 4 and mm.items[0].length == 2 * grid[1] * grid[2] // 4
    assert outs[0].outputs.token_ids == hf_greedy(hf, ids, list(mm.items), GREEDY.max_tokens)
    # the time axis turns only the slowest frequencies: compare the positions themselves
    kinds = {hf.config.image_token_id: 1, hf.config.video_token_id: 2}
    positions, delta = hf.model.get_rope_index(
        torch.tensor([ids]), torch.tensor([[kinds.get(t, 0) for t in ids]]),
        image_grid_thw=torch.tensor([mm.items[1].grid_thw]), video_grid_thw=torch.tensor([grid]))
    assert torch.equal(positions[:, 0], mm.positions) and int(delta) == mm.position_delta
    assert outs[1].error_code == 400 and "frames" in outs[1].error_msg
    long_video = np.zeros((200, 28, 28, 3), dtype=np.uint8)  # past max_frames: sampled evenly to 180
    _, sampled = llm.engine.multimodal.process(tokenizer("clip " + VIDEO)["input_ids"], {"video": [long_video]})
    assert sampled.items[0].grid_thw[0] == 180

    gif = clip(2, 56, 56, 30)
    messages = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": gif_data_url(gif)}},
                                             {"type": "text", "text": "What happens?"}]}]
    out = llm.chat(messages, GREEDY, use_tqdm=False)[0]
    assert out.error_code == 200, out.error_msg
    decoded = load_video(gif_data_url(gif))
    assert len(decoded) == 2
    expected = hf_reference(llm, hf, tokenizer(out.prompt, add_special_tokens=False)["input_ids"], [],
                            videos=[decoded])
    assert out.outputs.token_ids == expected


def test_video_settings_and_font_from_checkpoint(checkpoint, tmp_path):
    """The nested processor_config.json's video settings win, and its font file is used when present."""
    import json

    from PIL import ImageFont

    from fastllm.multimodal.ernie4_5_vl import Ernie4_5_VLProcessor

    path, hf, tokenizer = checkpoint
    (tmp_path / "stamp.ttf").write_bytes(ImageFont.load_default(10).font_bytes)
    (tmp_path / "processor_config.json").write_text(json.dumps({"video_processor": {
        "font": "stamp.ttf", "max_frames": 4, "size": {"shortest_edge": 28 * 28, "longest_edge": 28 * 28 * 4}}}))
    processor = Ernie4_5_VLProcessor(hf.config, tokenizer, str(tmp_path))
    assert processor.font_path == str(tmp_path / "stamp.ttf") and processor.max_frames == 4
    _, mm = processor.process(tokenizer("clip " + VIDEO)["input_ids"], {"video": [clip(6, 56, 56, 40)]})
    assert mm.items[0].grid_thw == (4, 4, 4)


def test_prefix_cache_keys_blocks_by_image(checkpoint):
    path, hf, tokenizer = checkpoint
    prompt = "Here is the first picture of a long list " + IMAGE + " tell me"
    check_prefix_cache_keys_blocks_by_image(
        path, tokenizer, prompt, image(112, 112, 3), image(112, 112, 4),
        lambda llm, second: hf_reference(llm, hf, tokenizer(prompt)["input_ids"], [second]))
