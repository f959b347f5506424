"""Runs the vision encoder for the images a step's prompt chunks reach, and keeps its outputs
until their last placeholder token has been through the model.

A chunked prefill may cut an image's placeholder run: the image is encoded once, when the
first chunk reaches it, and the later chunks take their rows from the cache. Entries are
keyed by the item's content hash (two requests with the same image share one), and the
cache holds at most ``budget`` embedding rows; an entry dropped early is encoded again.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Optional

import torch

from fastllm.worker.input_batch import ModelInputs
from fastllm.multimodal.inputs import MultimodalItem, StepMultimodal

ENCODER_CACHE_ROWS = 16384


class EncoderRunner:
    def __init__(self, model: Any, device: torch.device, budget: int = ENCODER_CACHE_ROWS):
        self.model, self.device, self.budget = model, device, budget
        self.cache: OrderedDict[bytes, torch.Tensor] = OrderedDict()

    def step_inputs(self, inputs: ModelInputs) -> Optional[StepMultimodal]:
        """The step's M-RoPE positions and placeholder embeddings, or None when no scheduled
        token lies in a multimodal prompt (1-D positions, with each sequence's delta, suffice)."""
        if not any(item.seq.multimodal is not None and item.seq.num_computed_tokens < item.seq.num_prompt_tokens
                   for item in inputs.order):
            return None
        positions, rows, embeds = [], [], []
        for item, offset in zip(inputs.order, inputs.token_offsets):
            seq, start = item.seq, item.seq.num_computed_tokens
            end = start + item.num_new_tokens
            mm = seq.multimodal
            if mm is None:
                positions.append(torch.arange(start, end).expand(3, -1))
                continue
            prompt_end = min(end, seq.num_prompt_tokens)
            positions.append(mm.positions[:, start:prompt_end])
            if end > max(start, prompt_end):  # generated tokens: one position, shifted by the delta
                positions.append(torch.arange(max(start, prompt_end), end).expand(3, -1) + mm.position_delta)
            for mm_item in mm.items_in(start, prompt_end):
                first, last = max(mm_item.offset, start), min(mm_item.end, prompt_end)
                embeds.append(self._embeddings(mm_item, done=last == mm_item.end)[first - mm_item.offset:
                                                                                   last - mm_item.offset])
                rows.append(torch.arange(offset + first - start, offset + last - start))
        hidden = self.model.model.embed_tokens.weight
        return StepMultimodal(
            positions=torch.cat(positions, dim=1).to(self.device),
            rows=(torch.cat(rows) if rows else torch.empty(0, dtype=torch.int64)).to(self.device),
            embeds=torch.cat(embeds) if embeds else hidden.new_empty(0, hidden.shape[-1]))

    def _embeddings(self, item: MultimodalItem, done: bool) -> torch.Tensor:
        """The item's encoder output; ``done``: its last placeholder is in this step, so the
        entry is no longer needed (by this sequence) afterwards."""
        cached = self.cache.pop(item.content_hash, None)
        out = cached if cached is not None else self.model.encode_multimodal(item)
        if not done:
            self.cache[item.content_hash] = out
            while sum(t.shape[0] for t in self.cache.values()) > self.budget and len(self.cache) > 1:
                self.cache.popitem(last=False)
        return out
