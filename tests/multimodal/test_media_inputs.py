"""Images through LLM.chat content parts and the OpenAI server; bad media fails only its request."""

from __future__ import annotations

import asyncio

import numpy as np
import openai
import pytest
from PIL import Image

from fastllm import LLM, SamplingParams
from fastllm.config import EngineConfig
from fastllm.engine.async_llm import AsyncLLM
from fastllm.engine.core_client import EngineCoreClient
from tests.conftest import needs_ranks
from tests.multimodal.tiny_vl import IMAGE, VIDEO, build_checkpoint, data_url, hf_greedy_mm, image
from tests.server.conftest import start_server

GREEDY = SamplingParams(max_tokens=5, temperature=0.0)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("qwen2_vl"))
    model, tokenizer = build_checkpoint(path, "qwen2_vl")
    return path, model, tokenizer


@pytest.fixture(scope="module")
def llm(checkpoint):
    return LLM(checkpoint[0], max_model_len=512, num_gpu_blocks_override=64, block_size=16,
               enable_mm=True, limit_mm_per_prompt={"image": 2, "video": 1})


def test_chat_image_parts_match_hf(checkpoint, llm, tmp_path):
    _, hf, tokenizer = checkpoint
    first, second = image(70, 50, 11), image(40, 40, 12)
    Image.fromarray(second).save(tmp_path / "second.png")
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "Compare "}, {"type": "image_url", "image_url": {"url": data_url(first)}},
        {"type": "text", "text": " with "}, {"type": "image_url", "image_url": {"url": str(tmp_path / "second.png")}},
    ]}]
    out = llm.chat(messages, GREEDY, use_tqdm=False)[0]
    assert out.error_code == 200, out.error_msg
    ids, mm = llm.engine.multimodal.process(tokenizer(out.prompt, add_special_tokens=False)["input_ids"],
                                            {"image": [Image.fromarray(first), Image.fromarray(second)]})
    assert out.outputs.token_ids == hf_greedy_mm(hf, ids, list(mm.items), GREEDY.max_tokens)


@pytest.mark.parametrize("media, reason", [
    ({"image": [b"not an image"]}, "cannot decode"),
    ({"image": [np.zeros((0, 10, 3), np.uint8)]}, "no content"),
    ({"image": [np.zeros((1, 100000, 3), np.uint8)]}, "elongated"),
    ({"image": [image(28, 28, 0)] * 3}, "limit_mm_per_prompt"),
    ({"image": ["https://example.com/cat.png"]}, "remote media"),
    ({"image": ["data:image/png;base64,@@@"]}, "base64"),
    ({"image": [image(28, 28, 0)] * 2}, "placeholders"),
    ({"audio": [b"x"]}, "unknown modality"),
    ({"video": ["clip.mp4"]}, "local media"),
])
def test_bad_media_fails_only_its_request(llm, media, reason):
    good = {"prompt": "ok " + IMAGE, "multimodal_data": {"image": [image(28, 28, 5)]}}
    bad = {"prompt": "bad " + IMAGE, "multimodal_data": media}
    outs = llm.generate([good, bad, good], GREEDY, use_tqdm=False)
    assert [o.error_code for o in outs] == [200, 400, 200]
    assert reason in outs[1].error_msg
    assert outs[0].outputs.token_ids == outs[2].outputs.token_ids and outs[0].outputs.token_ids


def test_server_image_url_parts(checkpoint, tmp_path):
    path, hf, tokenizer = checkpoint
    engine = AsyncLLM(EngineConfig(model=path, max_model_len=512, num_gpu_blocks_override=64, block_size=16,
                                   limit_mm_per_prompt={"image": 1}))
    server = start_server(engine, served_model_names=["vl"])
    try:
        client = server.client()
        pixels = image(56, 56, 21)
        Image.fromarray(pixels).save(tmp_path / "local.png")

        def ask(*urls: str):
            parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
            return client.chat.completions.create(
                model="vl", max_tokens=4, temperature=0,
                messages=[{"role": "user", "content": [{"type": "text", "text": "What is it?"}, *parts]}])

        answer = ask(data_url(pixels))
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": [
            {"type": "text", "text": "What is it?"}, {"type": "image"}]}], tokenize=False, add_generation_prompt=True)
        ids, mm = engine.engine.multimodal.process(tokenizer(prompt, add_special_tokens=False)["input_ids"],
                                                   {"image": [Image.fromarray(pixels)]})
        expected = hf_greedy_mm(hf, ids, list(mm.items), 4)
        assert answer.usage.completion_tokens == 4
        assert answer.choices[0].message.content == tokenizer.decode(expected, skip_special_tokens=True)
        for urls, reason in [(("https://example.com/a.png",), "allowed-media-domains"),
                             ((str(tmp_path / "local.png"),), "local media paths are not allowed"),
                             ((data_url(pixels), data_url(pixels)), "limit_mm_per_prompt"),
                             (("data:image/png;base64,AAAA",), "cannot decode")]:
            with pytest.raises(openai.BadRequestError, match=reason):
                ask(*urls)
    finally:
        server.stop()
        engine.shutdown(timeout=10)


def test_engine_core_sends_back_the_prompt_its_media_expanded(checkpoint, llm):
    """The core echoes no prompt, except token ids it made: media placeholders it expanded."""
    engine = EngineCoreClient(EngineConfig(model=checkpoint[0], max_model_len=512, num_gpu_blocks_override=64,
                                           block_size=16, limit_mm_per_prompt={"image": 1}))
    text, media = "ok " + IMAGE, {"image": [image(28, 28, 5)]}
    ids = llm.engine.inputs.tokenize(text)

    async def final():
        return [output async for output in engine.generate("mm", text, ids, GREEDY, multimodal_data=media)][-1]

    try:
        output = asyncio.run(final())
    finally:
        engine.shutdown(timeout=10)
    expanded = llm.engine.process_media(ids, media)[0]
    assert len(expanded) > len(ids) and (output.prompt, output.prompt_token_ids) == (text, expanded)


@needs_ranks(2)
def test_tensor_parallel_matches_one_rank(checkpoint, llm):
    """Rank 0 runs the vision encoder; the step's M-RoPE positions and embeddings reach rank 1."""
    prompt = {"prompt": "Two ranks " + IMAGE + " see", "multimodal_data": {"image": [image(60, 40, 31)]}}
    expected = llm.generate(prompt, GREEDY, use_tqdm=False)[0].outputs.token_ids
    sharded = LLM(checkpoint[0], max_model_len=512, num_gpu_blocks_override=64, block_size=16,
                  tensor_parallel_size=2, max_num_batched_tokens=16)
    try:
        assert sharded.generate(prompt, GREEDY, use_tqdm=False)[0].outputs.token_ids == expected
    finally:
        sharded.shutdown()


def test_remote_media_only_from_allowed_hosts_without_redirects():
    import http.server
    import threading

    from fastllm.engine.input_processor import RequestError
    from fastllm.multimodal.media import fetch_allowed

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/moved":
                self.send_response(302)
                self.send_header("Location", "http://localhost/internal")
                self.end_headers()
                return
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"png bytes")

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        assert fetch_allowed({"image": [base + "/a.png"]}, ["127.0.0.1"]) == {"image": [b"png bytes"]}
        assert fetch_allowed({"image": [base + "/a.png"]}, ["example.com"]) == {"image": [base + "/a.png"]}
        with pytest.raises(RequestError, match="redirect"):
            fetch_allowed({"image": [base + "/moved"]}, ["127.0.0.1"])
    finally:
        server.shutdown()


def animation_url(frames: list[np.ndarray], milliseconds: int) -> str:
    """An animated PNG (lossless, unlike GIF) data URL, each frame shown ``milliseconds``."""
    import base64
    import io

    buffer = io.BytesIO()
    first, *rest = [Image.fromarray(f) for f in frames]
    first.save(buffer, format="PNG", save_all=True, append_images=rest, duration=milliseconds, loop=0)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_video_inputs_match_hf(checkpoint, llm):
    """A video as a frame array, as a list of PIL frames, and as an encoded animation sampled at
    2 frames per second all give HF's tokens; an image and a video share one prompt."""
    _, hf, tokenizer = checkpoint
    frames = [image(56, 84, 40 + i) for i in range(4)]
    clip = np.stack(frames)
    prompt = "Frames " + IMAGE + " then " + VIDEO + " why?"
    still = image(60, 40, 44)
    # each frame twice for 250 ms, sampled every 500 ms: the four frames again
    encoded = animation_url([f for f in frames for _ in range(2)], 250)
    outs = llm.generate([{"prompt": prompt, "multimodal_data": {"image": [still], "video": [video]}}
                         for video in (clip, [Image.fromarray(f) for f in frames], encoded)], GREEDY, use_tqdm=False)
    assert [o.error_code for o in outs] == [200, 200, 200], [o.error_msg for o in outs]
    for out, video in zip(outs, (clip, clip, clip)):
        ids, mm = llm.engine.multimodal.process(tokenizer(prompt)["input_ids"],
                                                {"image": [Image.fromarray(still)], "video": [video]})
        assert out.outputs.token_ids == hf_greedy_mm(hf, ids, list(mm.items), GREEDY.max_tokens)


def test_video_url_chat_part_and_frame_limit(checkpoint, llm):
    _, hf, tokenizer = checkpoint
    frames = [image(56, 56, 50 + i) for i in range(2)]
    messages = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": animation_url(frames, 500)}},
                                             {"type": "text", "text": "What happens?"}]}]
    out = llm.chat(messages, GREEDY, use_tqdm=False)[0]
    assert out.error_code == 200, out.error_msg
    ids, mm = llm.engine.multimodal.process(tokenizer(out.prompt, add_special_tokens=False)["input_ids"],
                                            {"video": [np.stack(frames)]})
    assert out.outputs.token_ids == hf_greedy_mm(hf, ids, list(mm.items), GREEDY.max_tokens)
    # two frames of 400 s each: 1600 samples at 2 per second, refused before any is decoded
    long = {"role": "user", "content": [{"type": "video_url", "video_url": {"url": animation_url(frames, 400_000)}}]}
    refused = llm.chat([long], GREEDY, use_tqdm=False)[0]
    assert refused.error_code == 400 and "exceeds 768 frames" in refused.error_msg


def test_encoded_video_sampled_at_two_frames_per_second():
    """An MP4 of 8 frames at 4 fps (lossless RGB H.264) decodes to its frames 0, 2, 4, 6;
    bytes that are no video fail with a RequestError."""
    import io

    from fastllm.engine.input_processor import RequestError
    from fastllm.multimodal.media import load_video

    with pytest.raises(RequestError):
        load_video(b"not a video")
    av = pytest.importorskip("av")
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("libx264rgb", rate=4)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "rgb24"
        for i in range(8):
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), 30 * i, np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    frames = load_video(buffer.getvalue())
    assert frames.shape == (4, 48, 64, 3) and frames[:, 0, 0, 0].tolist() == [0, 60, 120, 180]
