"""What a quantization plugin provides: one ``Quantizer`` class per ``quantization=`` name.

The runner knows quantization only through this contract:

1. ``factory(checkpoint_config, **options)`` builds the quantizer. ``checkpoint_config`` is
   the checkpoint's ``quantization_config`` (config.json) when the weights on disk are already
   quantized with this method, else None: the float weights are quantized online. ``options``
   come from offline tools only (``alpha``: SmoothQuant's migration strength, the seed's -sq).
2. ``prepare_model(model)`` runs after the model is built and before its weights load; for a
   pre-quantized checkpoint it swaps each linear layer for a module whose weight loaders take
   the checkpoint's packed tensors.
3. ``quantize_model(model, calibrate)`` runs after the weights load: online methods swap the
   float linear layers for quantized ones; pre-quantized modules are checked and repacked.
   Offline tools pass their calibration text as ``calibrate``. Online, it is what the method's
   ``online_calibration(model, run_prompts)`` returns (None by default): the method picks the
   token ids (random ones tell how loud each input channel is, with no text from the user) and
   ``run_prompts`` runs them through the float model in a cache of their own.

``checkpoint_config_to_save()`` is what ``fastllm quantize`` writes as ``quantization_config``
so that the written directory loads through step 2 with no flag.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch.nn as nn

from fastllm.layers.linear import LinearBase
from fastllm.quantization.linear import QuantizedLinear, replace_linear_layers

# Runs the model over calibration prompts; methods that need activation statistics observe it.
Calibration = Callable[[], None]
# Runs token-id prompts through the model as loaded (the runner's throw-away prefill).
PromptRunner = Callable[[list[list[int]]], None]


class Quantizer:
    """One quantization method over every ``LinearBase`` of a model.

    Subclasses implement ``quantize_layer`` (online) and, when they read pre-quantized
    checkpoints, ``checkpoint_layer``; embeddings and the LM head stay in the model dtype.
    """

    name: str = ""

    def __init__(self, checkpoint_config: Optional[dict[str, Any]] = None, **options: Any):
        self.checkpoint_config = checkpoint_config
        self.options = options

    @property
    def prequantized(self) -> bool:
        return self.checkpoint_config is not None

    def prepare_model(self, model: nn.Module) -> None:
        if self.prequantized:
            replace_linear_layers(model, lambda name, layer: self.checkpoint_layer(layer))

    def quantize_model(self, model: nn.Module, calibrate: Optional[Calibration] = None) -> None:
        """``calibrate`` runs calibration tokens through the float model: offline tools' text, or
        online, ``online_calibration``'s."""
        if self.prequantized:
            replace_linear_layers(model, lambda name, module: module.finish_loading(name), QuantizedLinear)
        else:
            replace_linear_layers(model, lambda name, layer: self.quantize_layer(layer))

    def online_calibration(self, model: nn.Module, run_prompts: PromptRunner) -> Optional[Calibration]:
        """The calibration ``quantize_model`` gets when float weights are quantized at load (and by
        ``fastllm quantize`` without calibration ids): None, for methods that do not observe
        their inputs; otherwise one that calls ``run_prompts`` with prompts of this method's choice."""
        return None

    def quantize_layer(self, layer: LinearBase) -> nn.Module:
        """A quantized module computing what ``layer`` (float weights loaded) computes."""
        raise ValueError(f"quantization {self.name!r} is not applied online: it needs a checkpoint "
                         "already quantized with it (its config.json quantization_config)")

    def checkpoint_layer(self, layer: LinearBase) -> QuantizedLinear:
        """An empty module shaped like ``layer`` that loads this method's checkpoint tensors."""
        raise ValueError(f"quantization {self.name!r} does not read pre-quantized checkpoints")

    def checkpoint_config_to_save(self) -> dict[str, Any]:
        """The ``quantization_config`` that makes a saved model load back with this method."""
        return {"quant_method": self.name}
