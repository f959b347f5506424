"""Tiny random Qwen2-VL / Qwen2.5-VL checkpoints, their HF reference and test images."""

from __future__ import annotations

import base64
import io

import numpy as np
import torch

from fastllm.model_loader.gguf_loader import GGUFLoader
from fastllm.model_loader.resolve import embedded_model_path

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"
# Qwen2-VL's chat template, shortened: image / video parts render their placeholders
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}" + IMAGE +
    "{% elif part['type'] == 'video' %}" + VIDEO + "{% else %}{{ part['text'] }}{% endif %}{% endfor %}"
    "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]})
VISION = {
    "qwen2_vl": dict(depth=2, embed_dim=32, num_heads=2, hidden_size=64, mlp_ratio=2,
                     patch_size=14, spatial_merge_size=2, temporal_patch_size=2),
    "qwen2_5_vl": dict(depth=3, hidden_size=32, num_heads=2, intermediate_size=48, out_hidden_size=64,
                       patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                       fullatt_block_indexes=[1], tokens_per_second=2),
}


def build_checkpoint(path: str, kind: str) -> tuple[torch.nn.Module, object]:
    """Write a random ``kind`` checkpoint with a vision-token tokenizer and a small-image
    processor to ``path``; return HF's model on it and the tokenizer."""
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer = GGUFLoader().load_tokenizer(embedded_model_path(), None)
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    tokenizer.chat_template = CHAT_TEMPLATE
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    config = AutoConfig.for_model(
        kind, text_config=dict(TEXT, vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                               bos_token_id=tokenizer.bos_token_id),
        vision_config=VISION[kind], image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    Qwen2VLImageProcessorPil(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16).save_pretrained(path)
    return model, tokenizer


def image(width: int, height: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def data_url(pixels: np.ndarray) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def hf_greedy_mm(model, token_ids: list[int], items: list, max_new_tokens: int) -> list[int]:
    """HF's greedy continuation of an expanded prompt with the items fastllm's processor made."""
    images = [i for i in items if i.modality == "image"]
    videos = [i for i in items if i.modality == "video"]
    ids = torch.tensor([token_ids])
    kwargs = {"mm_token_type_ids": torch.tensor([[1 if t == model.config.image_token_id else
                                                   2 if t == model.config.video_token_id else 0
                                                   for t in token_ids]])}
    if images:
        kwargs["pixel_values"] = torch.cat([i.pixel_values for i in images])
        kwargs["image_grid_thw"] = torch.tensor([i.grid_thw for i in images])
    if videos:
        kwargs["pixel_values_videos"] = torch.cat([i.pixel_values for i in videos])
        kwargs["video_grid_thw"] = torch.tensor([i.grid_thw for i in videos])
        if model.config.model_type == "qwen2_5_vl":
            kwargs["second_per_grid_ts"] = torch.tensor([i.extra[0] for i in videos])
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0, **kwargs)
    return out[0, len(token_ids):].tolist()


def check_prefix_cache_keys_blocks_by_image(path: str, tokenizer, prompt: str, first: np.ndarray,
                                            second: np.ndarray, hf_tokens) -> None:
    """The same image prompt run cold, again, and with another image, on a prefix-caching engine:
    blocks over the image hit only for the same image, and the other image's output is
    ``hf_tokens(llm, second)``, HF's greedy tokens for it."""
    from PIL import Image

    from fastllm import LLM, SamplingParams

    llm = LLM(path, max_model_len=512, num_gpu_blocks_override=64, block_size=16, enable_prefix_caching=True)
    processed = llm.engine.multimodal.process(tokenizer(prompt)["input_ids"], {"image": [Image.fromarray(first)]})
    item = processed[1].items[0]
    greedy = SamplingParams(max_tokens=6, temperature=0.0)
    cold, same, other = (llm.generate({"prompt": prompt, "multi_modal_data": {"image": pixels}}, greedy,
                                      use_tqdm=False)[0] for pixels in (first, first, second))
    assert cold.num_cached_tokens == 0
    assert same.num_cached_tokens > item.offset + item.length - 16  # blocks over the image hit
    assert other.num_cached_tokens <= item.offset  # only text blocks before the image
    assert same.outputs.token_ids == cold.outputs.token_ids
    assert other.outputs.token_ids == hf_tokens(llm, second)
