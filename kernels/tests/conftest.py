"""Without CUDA, run every kernel through Triton's interpreter (set before triton is imported)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
