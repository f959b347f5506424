"""Pipeline parallelism in a model: the modules another stage holds are stand-ins without weights."""

from __future__ import annotations

import torch.nn as nn


class OtherStage(nn.Module):
    """Where a module of another pipeline stage would be: no parameters, never called.

    It keeps the module names (``model.layers.17...``) of the whole model, so checkpoint
    tensors and KV-cache slots keep their layer numbers on every stage.
    """


def on_this_stage(model: nn.Module, name: str) -> bool:
    """Whether the parameter ``name`` (dotted path) belongs to a module this stage holds."""
    module = model
    for part in name.split(".")[:-1]:
        module = getattr(module, part, None)
        if module is None or isinstance(module, OtherStage):
            return module is None  # a name this model does not know is the caller's error to report
    return True
