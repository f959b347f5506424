"""How loud each linear layer's input channels are: their mean squares over a calibration run.

A weight's rounding error reaches the layer's output multiplied by its input, so the error that
matters is each weight's squared error times its input's mean square (the diagonal of GPTQ's
Hessian; llama.cpp's importance matrix). Group scales fitted under those weights spend the grid
on the weights that meet loud inputs. Which channels are loud comes from the model itself (the
residual stream's outlier channels, the norms' gains), so online the runner's random token ids
do as well as real text, with no data to ship (figures: benchmarks/RESULTS.md).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional

import torch
import torch.nn as nn

from fastllm.layers.linear import LinearBase
from fastllm.quantization import Calibration, PromptRunner, Quantizer, replace_linear_layers

logger = logging.getLogger("fastllm")
SILENT = 1e-6  # floor of a channel's relative loudness: a group of silent inputs still gets a fit
# Online, this many random token ids in prompts of up to CALIBRATION_LENGTH (seeded: every
# tensor-parallel rank runs the same ones, so the layers' collectives pair up).
CALIBRATION_TOKENS = 4096
CALIBRATION_LENGTH = 1024


def relative_loudness(mean_square: torch.Tensor) -> torch.Tensor:
    """Per-channel mean squares scaled to mean 1 (only their ratios weigh the fits)."""
    return (mean_square.float() / mean_square.float().mean().clamp(min=1e-30)).clamp(min=SILENT)


def per_group(loudness: Optional[torch.Tensor], group_size: int, device: torch.device) -> Optional[torch.Tensor]:
    """``[K]`` loudness -> ``[K / group, group]``, to weigh the fits of ``[..., K / group, group]`` groups."""
    return None if loudness is None else loudness.to(device).unflatten(0, (-1, group_size))


@torch.no_grad()
def observe_linear_inputs(model: nn.Module, calibrate: Calibration,
                          observe: Callable[[str, torch.Tensor], None]) -> None:
    """Run ``calibrate`` with ``observe(qualified name, inputs [tokens, features])`` called on
    every linear layer's inputs."""
    def observer(name: str):
        def hook(module: nn.Module, args: tuple) -> None:
            observe(name, args[0].detach().reshape(-1, args[0].shape[-1]))
        return hook

    handles = [module.register_forward_pre_hook(observer(name)) for name, module in model.named_modules()
               if isinstance(module, LinearBase)]
    try:
        calibrate()
    finally:
        for handle in handles:
            handle.remove()


def input_loudness(model: nn.Module, calibrate: Calibration) -> dict[str, torch.Tensor]:
    """Qualified name of each linear layer ``calibrate`` reaches -> its inputs' relative loudness."""
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}

    def observe(name: str, x: torch.Tensor) -> None:
        squares = x.float().square().sum(0)
        sums[name] = sums[name] + squares if name in sums else squares
        counts[name] = counts.get(name, 0) + x.shape[0]

    observe_linear_inputs(model, calibrate, observe)
    return {name: relative_loudness(total / counts[name]) for name, total in sums.items()}


def random_token_prompts(config: object) -> list[list[int]]:
    """``CALIBRATION_TOKENS`` seeded random ids of the model's vocabulary, in prompts of up to
    ``CALIBRATION_LENGTH`` (and the model's context)."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(config.vocab_size, (CALIBRATION_TOKENS,), generator=generator).tolist()
    length = min(CALIBRATION_LENGTH, getattr(config, "max_position_embeddings", CALIBRATION_LENGTH))
    return [ids[start:start + length] for start in range(0, CALIBRATION_TOKENS // length * length, length)]


class InputAwareQuantizer(Quantizer):
    """An online method whose scale fits weigh each weight by its input's loudness, when the
    runner (or an offline tool) gives a calibration; without one, every input counts alike."""

    def online_calibration(self, model: nn.Module, run_prompts: PromptRunner) -> Optional[Calibration]:
        """Random token ids through the model as loaded, before it is quantized."""
        prompts = random_token_prompts(model.config)
        return lambda: run_prompts(prompts)

    def quantize_model(self, model: nn.Module, calibrate: Optional[Calibration] = None) -> None:
        if self.prequantized or calibrate is None:
            super().quantize_model(model)
            return
        start = time.perf_counter()
        loudness = input_loudness(model, calibrate)
        logger.info("%s: input loudness of %d linear layers in %.1f s", self.name, len(loudness),
                    time.perf_counter() - start)
        replace_linear_layers(model, lambda name, layer: self.quantize_layer(layer, loudness.get(name)))

    def quantize_layer(self, layer: LinearBase, loudness: Optional[torch.Tensor] = None) -> nn.Module:
        """``loudness [input features]``: the relative mean square of each input, or None."""
        raise NotImplementedError
