"""Helpers the quantization methods of this plugin share."""

from __future__ import annotations

from typing import Any

from fastllm.quantization import CheckpointLayoutError, Quantizer


def group_size_for(input_size: int, preferred: int) -> int:
    """The largest power of two up to ``preferred`` dividing ``input_size`` (576 -> 64 for 128).

    The kernels walk K one group at a time; loading recomputes the same value from the layer,
    so a saved checkpoint needs only the preferred size.
    """
    size = 1 << (min(preferred, input_size).bit_length() - 1)
    while size > 16 and input_size % size:
        size //= 2
    if input_size % size:
        raise ValueError(f"input features {input_size} are not a multiple of 16")
    return size


def require(config: dict[str, Any], key: str, expected: Any, method: str) -> None:
    """Refuse a checkpoint whose quantization_config asks for a variant this plugin cannot run."""
    if config.get(key, expected) != expected:
        raise CheckpointLayoutError(f"{method} checkpoints with {key}={config[key]!r} are not supported "
                                    f"(only {key}={expected!r})")


def option(quantizer: Quantizer, key: str, default: int) -> int:
    """An integer setting: from the checkpoint's quantization_config when loading a saved model,
    else from the quantizer's options (given to its constructor), else ``default``."""
    source = quantizer.checkpoint_config if quantizer.prequantized else quantizer.options
    return int(source.get(key, default))
