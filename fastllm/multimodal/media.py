"""Loads and checks user media (images, video frames) before any processor sees them.

Every value here is client-sent: a decode error, an empty or absurd image, or too many
items fails only its request (``RequestError``, 400).
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import urllib.parse
import urllib.request
from typing import Any, Optional

import numpy as np

from fastllm.engine.input_processor import RequestError

MAX_MEDIA_BYTES = 20 * 1024 * 1024
MAX_IMAGE_PIXELS = 8192 * 8192
MAX_ASPECT_RATIO = 200  # what the Qwen-VL resizers accept
MAX_VIDEO_FRAMES = 768
MAX_VIDEO_PIXELS = 256 * 1024 * 1024  # over all frames: what one video may expand to in memory
VIDEO_FPS = 2.0  # the rate encoded videos are sampled at, and decoded frames are taken to have (as vLLM)
MAX_ANIMATION_FRAMES = 16 * MAX_VIDEO_FRAMES  # frames an animated image may hold before sampling
GIF_FRAME_MS = 100  # how long browsers show an animation frame that gives no (or no positive) duration
MODALITIES = ("image", "video")


def _pil() -> Any:
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - pillow is a dependency of the vision extra
        raise RequestError("images need Pillow: pip install 'fastllm[vision]'", 500) from exc
    return Image


def decode_data_url(url: str) -> bytes:
    """The payload of a ``data:<mime>;base64,<data>`` URL."""
    header, _, data = url.partition(",")
    if not header.startswith("data:") or not header.endswith(";base64") or not data:
        raise RequestError("a data URL must look like data:<mime>;base64,<data>")
    if len(data) > MAX_MEDIA_BYTES * 4 // 3 + 4:
        raise RequestError(f"media larger than {MAX_MEDIA_BYTES} bytes")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RequestError(f"invalid base64 in a data URL: {exc}") from exc


def read_local_file(path: str, allowed_root: Optional[str]) -> bytes:
    """A local media file, only beneath ``allowed_root`` (symlinks resolved first)."""
    if allowed_root is None:
        raise RequestError("local media paths are not allowed here")
    real, root = os.path.realpath(path), os.path.realpath(allowed_root)
    if os.path.commonpath([real, root]) != root:
        raise RequestError("local media path is outside the allowed directory")
    if not os.path.isfile(real):
        raise RequestError("local media file not found")
    if os.path.getsize(real) > MAX_MEDIA_BYTES:
        raise RequestError(f"media larger than {MAX_MEDIA_BYTES} bytes")
    with open(real, "rb") as f:
        return f.read()


def _source_bytes(source: str, local_root: Optional[str]) -> bytes:
    if source.startswith("data:"):
        return decode_data_url(source)
    if source.startswith(("http://", "https://")):
        raise RequestError("remote media URLs are refused unless the server allows their domain "
                           "(--allowed-media-domains); send a data URL")
    return read_local_file(source.removeprefix("file://"), local_root)


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """An allowed host must serve the media itself: a redirect could lead anywhere."""

    def redirect_request(self, *args: Any) -> None:
        raise RequestError("media URLs that redirect are refused")


_NO_REDIRECTS = urllib.request.build_opener(_RefuseRedirects)


def fetch_allowed(media: dict[str, list[Any]], domains: Optional[list[str]]) -> dict[str, list[Any]]:
    """``media`` with each http(s) URL whose host is in ``domains`` replaced by its bytes (at
    most MAX_MEDIA_BYTES); other URLs are left for ``load_media`` to refuse. Blocking: the
    server calls it off its event loop, before the request reaches the engine."""
    allowed = {d.lower() for d in domains or []}

    def fetched(item: Any) -> Any:
        if not (isinstance(item, str) and item.startswith(("http://", "https://"))):
            return item
        if (urllib.parse.urlsplit(item).hostname or "").lower() not in allowed:
            return item
        try:
            with _NO_REDIRECTS.open(item, timeout=10) as response:
                body = response.read(MAX_MEDIA_BYTES + 1)
        except OSError as exc:
            raise RequestError(f"cannot fetch the media URL: {exc}") from exc
        if len(body) > MAX_MEDIA_BYTES:
            raise RequestError(f"media larger than {MAX_MEDIA_BYTES} bytes")
        return body

    return {modality: [fetched(item) for item in items] for modality, items in media.items()}


def _check_size(width: int, height: int) -> None:
    if width < 1 or height < 1:
        raise RequestError(f"an image of {width}x{height} pixels has no content")
    if width * height > MAX_IMAGE_PIXELS:
        raise RequestError(f"an image of {width}x{height} pixels exceeds {MAX_IMAGE_PIXELS} pixels")
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        raise RequestError(f"an image of {width}x{height} pixels is too elongated "
                           f"(aspect ratio above {MAX_ASPECT_RATIO})")


def _resolve(source: Any, modality: str, local_root: Optional[str]) -> Any:
    """The item itself, or the bytes that its dict (``{"url": ...}``), URL or path names; bytes
    within MAX_MEDIA_BYTES."""
    if isinstance(source, dict):
        source = source.get("url", source.get(modality))
    if isinstance(source, str):
        source = _source_bytes(source, local_root)
    if isinstance(source, (bytes, bytearray)) and len(source) > MAX_MEDIA_BYTES:
        raise RequestError(f"media larger than {MAX_MEDIA_BYTES} bytes")
    return source


def load_image(source: Any, local_root: Optional[str] = None) -> Any:
    """A decoded RGB PIL image from a PIL image, an ``[H, W(, C)]`` uint8 array, encoded bytes,
    a data URL, or (where ``local_root`` allows) a local path."""
    Image = _pil()
    source = _resolve(source, "image", local_root)
    if isinstance(source, (bytes, bytearray)):
        try:
            with Image.open(io.BytesIO(source)) as opened:
                _check_size(*opened.size)  # before decoding: a decompression bomb never expands
                image = opened.convert("RGB")
        except (OSError, ValueError, Image.DecompressionBombError) as exc:
            raise RequestError(f"cannot decode the image: {exc}") from exc
    elif isinstance(source, np.ndarray):
        if source.ndim not in (2, 3) or source.dtype != np.uint8:
            raise RequestError("an image array must be uint8 [H, W] or [H, W, C]")
        _check_size(source.shape[1], source.shape[0])
        image = Image.fromarray(source).convert("RGB")
    elif isinstance(source, Image.Image):
        image = source.convert("RGB")
    else:
        raise RequestError(f"unsupported image input of type {type(source).__name__}")
    _check_size(*image.size)
    return image


def _sample_times(starts: list[float], duration: float) -> list[int]:
    """Indices of the frames showing at ``0, 1/VIDEO_FPS, 2/VIDEO_FPS, ...`` before ``duration``."""
    picked, frame = [], 0
    steps = max(1, int(np.ceil(duration * VIDEO_FPS - 1e-9)))
    if steps > MAX_VIDEO_FRAMES:
        raise RequestError(f"a video of {duration:.1f} s sampled at {VIDEO_FPS:g} frames per second exceeds "
                           f"{MAX_VIDEO_FRAMES} frames")
    for step in range(steps):
        while frame + 1 < len(starts) and starts[frame + 1] <= step / VIDEO_FPS + 1e-9:
            frame += 1
        picked.append(frame)
    return picked


def _check_video(frames: int, width: int, height: int) -> None:
    _check_size(width, height)
    if frames * width * height > MAX_VIDEO_PIXELS:
        raise RequestError(f"{frames} frames of {width}x{height} pixels exceed {MAX_VIDEO_PIXELS} pixels")


def _decode_animation(data: bytes) -> Optional[np.ndarray]:
    """Frames of an animated GIF / WebP / PNG through Pillow; None for what Pillow cannot open."""
    Image = _pil()
    try:
        with Image.open(io.BytesIO(data)) as opened:
            count = getattr(opened, "n_frames", 1)
            if count > MAX_ANIMATION_FRAMES:
                raise RequestError(f"an animation of {count} frames exceeds {MAX_ANIMATION_FRAMES} frames")
            _check_video(count, *opened.size)
            starts, durations = [], []
            for index in range(count):
                opened.seek(index)
                starts.append(sum(durations))
                durations.append((opened.info.get("duration") or GIF_FRAME_MS) / 1000)
            picked = _sample_times(starts, sum(durations))
            frames = []
            for index in picked:
                opened.seek(index)
                frames.append(np.asarray(opened.convert("RGB")))
    except Image.UnidentifiedImageError:
        return None
    except (OSError, ValueError, EOFError, Image.DecompressionBombError) as exc:
        raise RequestError(f"cannot decode the video: {exc}") from exc
    return np.stack(frames)


def _decode_container(data: bytes) -> np.ndarray:
    """Frames of an MP4 / WebM / ... through PyAV, sampled at VIDEO_FPS."""
    try:
        import av
    except ImportError as exc:
        raise RequestError("only animated GIF/WebP/PNG videos can be decoded here (PyAV is not installed): "
                           "pass the frames ([T, H, W, 3] or a list of images)") from exc
    frames, next_time = [], 0.0
    try:
        with av.open(io.BytesIO(data)) as container:
            if not container.streams.video:
                raise RequestError("the media has no video stream")
            stream = container.streams.video[0]
            _check_size(stream.codec_context.width, stream.codec_context.height)
            for frame in container.decode(stream):
                time = frame.time or 0.0
                if time + 1e-9 < next_time:
                    continue
                if len(frames) == MAX_VIDEO_FRAMES:
                    raise RequestError(f"a video sampled at {VIDEO_FPS:g} frames per second exceeds "
                                       f"{MAX_VIDEO_FRAMES} frames")
                frames.append(frame.to_ndarray(format="rgb24"))
                _check_video(len(frames), frames[-1].shape[1], frames[-1].shape[0])
                next_time = (np.floor(time * VIDEO_FPS + 1e-9) + 1) / VIDEO_FPS
    except av.error.FFmpegError as exc:
        raise RequestError(f"cannot decode the video: {exc}") from exc
    if not frames:
        raise RequestError("the video has no frames")
    return np.stack(frames)


def load_video(source: Any, local_root: Optional[str] = None) -> np.ndarray:
    """Frames as a ``[T, H, W, 3]`` uint8 array, from such an array, a list of images, or an
    encoded video (bytes, a data URL, or where ``local_root`` allows a local path) sampled at
    VIDEO_FPS."""
    source = _resolve(source, "video", local_root)
    if isinstance(source, (bytes, bytearray)):
        frames = _decode_animation(bytes(source))
        if frames is None:
            frames = _decode_container(bytes(source))
    elif isinstance(source, np.ndarray) and source.ndim == 4:
        frames = source
    elif isinstance(source, (list, tuple)) and source:
        frames = np.stack([np.asarray(load_image(frame)) for frame in source])
    else:
        raise RequestError("a video must be a [T, H, W, 3] uint8 array, a list of frames, or encoded bytes")
    if frames.dtype != np.uint8 or frames.shape[-1] != 3:
        raise RequestError("video frames must be uint8 RGB")
    if not 1 <= len(frames) <= MAX_VIDEO_FRAMES:
        raise RequestError(f"a video must have 1 to {MAX_VIDEO_FRAMES} frames, got {len(frames)}")
    _check_video(len(frames), frames.shape[2], frames.shape[1])
    return frames


def load_media(data: dict[str, Any], limits: dict[str, int], local_root: Optional[str]) -> dict[str, list[Any]]:
    """Every item of a prompt's ``multimodal_data`` loaded and checked; ``limits`` caps the
    items per modality (``limit_mm_per_prompt``)."""
    if not isinstance(data, dict):
        raise RequestError("multimodal_data must map a modality ('image', 'video') to its items")
    loaded: dict[str, list[Any]] = {}
    for modality, items in data.items():
        if modality not in MODALITIES:
            raise RequestError(f"unknown modality {modality!r}; expected one of {', '.join(MODALITIES)}")
        items = list(items) if isinstance(items, (list, tuple)) else [items]
        limit = limits.get(modality, 0)
        if len(items) > limit:
            raise RequestError(f"{len(items)} {modality} items in one prompt exceed "
                               f"limit_mm_per_prompt[{modality!r}]={limit}")
        if modality == "image":
            loaded[modality] = [load_image(item, local_root) for item in items]
        else:
            loaded[modality] = [load_video(item, local_root) for item in items]
    return loaded
