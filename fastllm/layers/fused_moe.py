"""Mixture-of-Experts: one router, stacked expert weights, one grouped expert computation.

Every MoE model (ERNIE-4.5, Qwen3-MoE, Mixtral) builds a ``FusedMoE``; models differ only in
how the router picks experts (``TopKRouter``'s options) and in whether shared experts run
beside the routed ones. Expert weights are stacked so that a grouped kernel reads them as
one tensor: ``w13 [E, 2 * I, H]`` (each expert's gate rows, then its up rows) and
``w2 [E, H, I]``. Tensor parallelism shards every expert's intermediate dimension (w13 by
rows, w2 by columns) and sums the ranks' partial outputs once, after the weighted combine.
Expert parallelism (``enable_expert_parallel``) is a placement instead: each tensor-parallel
rank holds ``E / ranks`` experts whole (``expert_ids``, the only ones the loader fills). Small
steps run every replicated token's routes to the local experts and the same sum adds the ranks'
parts; steps of many tokens split the tokens over the ranks, send each only to the ranks holding
its experts and back (``fastllm.distributed.expert_dispatch``), and gather the rows again
(``parallel_state.use_expert_all_to_all`` picks). Under data-parallel attention (``data_parallel_size``
replicas with ``enable_expert_parallel``) the experts are placed over the replicas instead: each
layer gathers every replica's tokens, runs their routes to the local experts, sums the ranks' parts
and keeps its own rows.
"""

from __future__ import annotations

import re
from types import ModuleType
from typing import Callable, Optional, Union

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from fastllm.attention.metadata import get_forward_context
from fastllm.distributed.expert_dispatch import all_gather_rows, dispatch_combine, gather_replica_tokens, token_share
from fastllm.distributed.parallel_state import (all_reduce, ep_rank, ep_size, experts_over_replicas, tp_group,
                                                tp_rank, tp_size, use_expert_all_to_all)
from fastllm.layers.fused import current_kernels
from fastllm.platforms.side_stream import run_beside

ACTIVATIONS = {"silu": F.silu}
# HF checkpoints' names of an expert's gate, up and down projections; a model whose checkpoints
# name them otherwise declares its own ``expert_projections`` (Mixtral), for loading and export alike
EXPERT_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def fused_experts(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, activation: str = "silu", w13_scale: Optional[torch.Tensor] = None,
                  w2_scale: Optional[torch.Tensor] = None, kernels: Optional[ModuleType] = None,
                  w13_zero: Optional[torch.Tensor] = None, w2_zero: Optional[torch.Tensor] = None,
                  book: Optional[torch.Tensor] = None, pair_rows: bool = False,
                  addend: Union[torch.Tensor, Callable[[], torch.Tensor], None] = None) -> torch.Tensor:
    """``hidden [T, H]`` through each token's ``k`` experts, weighted and summed -> ``[T, H]``.
    ``pair_rows``: the kernels may instead return the weighted rows unsummed, ``[T, k, H]``
    (float32), for a norm that adds them (``RMSNorm`` takes summands). ``addend [T, H]`` (the
    shared experts' output) is added to the sum (the kernels, in the pass that sums the rows); it
    may be a function that returns it, called right before that pass.

    ``topk_weights [T, k]`` float32, ``topk_ids [T, k]`` integer indices into ``w13``/``w2``'s
    first dimension. ``w13_scale [E, 2I]`` / ``w2_scale [E, H]``: the weights are float8 with
    these per-channel scales (fp8 experts). 4-bit experts: uint8 weights of two codes a byte
    (the even input in the low nibble) with scales ``[E, rows, K / group]`` and either zeros of
    that shape (int4: ``(code - zero) * scale``) or a 16-value code ``book`` (nf4: ``book[code] *
    scale``). ``kernels`` (the layer's, see ``fastllm.layers.fused``) runs it where it has
    ``fused_experts``; the torch reference below runs anywhere.
    """
    if kernels is not None and hasattr(kernels, "fused_experts"):
        options = {"w13_scale": w13_scale, "w2_scale": w2_scale, "w13_zero": w13_zero, "w2_zero": w2_zero,
                   "book": book, "pair_rows": pair_rows or None, "addend": addend}
        return kernels.fused_experts(hidden, w13, w2, topk_weights, topk_ids, activation=activation,
                                     **{name: value for name, value in options.items() if value is not None})
    out = fused_experts_reference(hidden, w13, w2, topk_weights, topk_ids, activation, w13_scale, w2_scale,
                                  w13_zero, w2_zero, book)
    if callable(addend):
        addend = addend()
    return out if addend is None else out + addend


def fused_experts_reference(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                            topk_weights: torch.Tensor, topk_ids: torch.Tensor, activation: str = "silu",
                            w13_scale: Optional[torch.Tensor] = None,
                            w2_scale: Optional[torch.Tensor] = None, w13_zero: Optional[torch.Tensor] = None,
                            w2_zero: Optional[torch.Tensor] = None,
                            book: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Sort the (token, slot) pairs by expert, run each expert that received any on its tokens
    in one matmul pair, and add the weighted results back in ascending expert order (as HF does).
    Quantized (fp8, 4-bit) experts are dequantized one at a time."""
    act = ACTIVATIONS[activation]
    k = topk_ids.shape[1]
    flat_ids = topk_ids.flatten()
    order = flat_ids.argsort(stable=True)
    counts = torch.bincount(flat_ids, minlength=w13.shape[0]).tolist()
    flat_weights = topk_weights.flatten()
    out = torch.zeros_like(hidden)
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        slots = order[start:start + count]
        start += count
        tokens = slots // k
        gate, up = F.linear(hidden[tokens], _expert_weight(w13, w13_scale, w13_zero, book, expert,
                                                           hidden.dtype)).chunk(2, dim=-1)
        y = F.linear(act(gate) * up, _expert_weight(w2, w2_scale, w2_zero, book, expert, hidden.dtype))
        out.index_add_(0, tokens, y * flat_weights[slots, None].to(y.dtype))
    return out


def _expert_weight(weights: torch.Tensor, scale: Optional[torch.Tensor], zero: Optional[torch.Tensor],
                   book: Optional[torch.Tensor], expert: int, dtype: torch.dtype) -> torch.Tensor:
    if scale is None:
        return weights[expert]
    if weights.dtype != torch.uint8:
        return (weights[expert].float() * scale[expert, :, None]).to(dtype)
    packed = weights[expert]
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2).unflatten(-1, (scale.shape[-1], -1))
    values = book.float()[codes.long()] if zero is None else codes.float() - zero[expert, ..., None].float()
    return (values * scale[expert, ..., None].float()).flatten(-2).to(dtype)


def local_routes(topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                 expert_map: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Routes as indices into this rank's experts (expert parallelism). A route to another rank's
    expert keeps its slot, on local expert 0 with weight 0: the grouped kernels take a fixed
    ``[T, k]`` (no host sync, capturable), and the weighted sum is unchanged."""
    local = expert_map[topk_ids]
    elsewhere = local < 0
    return topk_weights.masked_fill(elsewhere, 0.0), local.masked_fill(elsewhere, 0)


class TopKRouter(nn.Module):
    """Router logits -> softmax -> top-k -> (optional) renormalisation, as transformers routes.

    ``score_correction_bias``: ERNIE-4.5 picks experts by ``softmax + e_score_correction_bias``
    but weights them by the softmax alone; its weights are renormalised with a floor
    ``norm_min`` on the sum. ``float32_logits``: ERNIE computes its router in float32; with the
    kernels, for bfloat16 rows, as one 16-bit GEMM over the weight's three bfloat16 terms
    (``float32_router_logits``), not as a widened copy and a float32 GEMM. One token (batch-1
    decode) takes the kernels' ``router_topk``: router and routing in one launch.
    """

    def __init__(self, hidden_size: int, num_experts: int, top_k: int, renormalize: bool = True,
                 score_correction_bias: bool = False, norm_min: float = 0.0, float32_logits: bool = False):
        super().__init__()
        self.top_k, self.renormalize, self.norm_min = top_k, renormalize, norm_min
        self.float32_logits = float32_logits
        self.kernels = current_kernels()
        dtype = torch.float32 if float32_logits else None
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size, dtype=dtype), requires_grad=False)
        self.weight_terms: Optional[torch.Tensor] = None  # [3E, H] bfloat16, set as the weight loads
        if float32_logits and hasattr(self.kernels, "float32_router_logits") and hasattr(self.kernels, "topk_softmax"):
            self.weight.weight_loader = self._load_float32_weight
        if score_correction_bias:
            self.e_score_correction_bias = nn.Parameter(torch.zeros(num_experts, dtype=torch.float32),
                                                        requires_grad=False)
            self.e_score_correction_bias.weight_loader = _load_reshaped
        else:
            self.register_parameter("e_score_correction_bias", None)

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``hidden [T, H]`` -> (``topk_weights [T, k]`` float32, ``topk_ids [T, k]``)."""
        if hidden.shape[0] == 1 and self.kernels is not None and hasattr(self.kernels, "router_topk"):
            return self.kernels.router_topk(hidden, self.weight, self.top_k, self.renormalize, self.norm_min,
                                            self.e_score_correction_bias, round_logits=not self.float32_logits)
        if self.weight_terms is not None and hidden.dtype == torch.bfloat16:
            logits = self.kernels.float32_router_logits(hidden, self.weight_terms)  # [T, 3, E]: topk_softmax sums them
        elif self.float32_logits:
            logits = F.linear(hidden.float(), self.weight.float())
        elif self.kernels is not None:  # a dependent-launch GEMV at batch 1, not a two-block BLAS call
            logits = self.kernels.linear(hidden, self.weight)
        else:
            logits = F.linear(hidden, self.weight)
        if self.kernels is not None and hasattr(self.kernels, "topk_softmax"):
            return self.kernels.topk_softmax(logits, self.top_k, self.renormalize, self.norm_min,
                                        self.e_score_correction_bias)
        probs = F.softmax(logits, dim=-1, dtype=torch.float32)
        scores = probs if self.e_score_correction_bias is None else probs + self.e_score_correction_bias
        topk_ids = torch.topk(scores, self.top_k, dim=-1).indices
        topk_weights = probs.gather(-1, topk_ids)
        if self.renormalize:
            topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True).clamp(min=self.norm_min)
        return topk_weights, topk_ids

    def _load_float32_weight(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        _load_reshaped(param, loaded, shard_id)
        self.weight_terms = self.kernels.bfloat16_terms(param.data)


class FusedMoE(nn.Module):
    """A sparse MoE block: router, routed experts and (optionally) shared experts.

    ``shared_experts`` is a dense MLP every token runs (ERNIE-4.5); it does its own
    tensor-parallel reduction, the routed experts do one after their weighted combine.
    ``leaves_pair_sum`` (set by the model where an RMSNorm with the residual comes next on this
    stage): without shared experts or ranks to sum over, the output may be each token's weighted
    expert rows, ``[T, k, H]``, summed by that norm (batch-1 decode: one launch fewer).
    """

    leaves_pair_sum = False

    def __init__(self, router: TopKRouter, intermediate_size: int, shared_experts: Optional[nn.Module] = None,
                 activation: str = "silu"):
        super().__init__()
        self.num_experts, hidden_size = router.weight.shape
        # each expert's intermediate features are sliced over the ranks, or (EP) not at all
        self.slices, self.slice_rank = (1, 0) if ep_size() > 1 else (tp_size(), tp_rank())
        if intermediate_size % self.slices:
            raise ValueError(f"{intermediate_size} expert intermediate features cannot be split over "
                             f"tensor_parallel_size={tp_size()}")
        if self.num_experts % ep_size():
            raise ValueError(f"{self.num_experts} experts cannot be placed over tensor_parallel_size={ep_size()} "
                             "with enable_expert_parallel")
        if activation not in ACTIVATIONS:
            raise ValueError(f"expert activation {activation!r} is not supported ({', '.join(ACTIVATIONS)})")
        self.activation = activation
        per_rank = self.num_experts // ep_size()
        self.expert_ids = list(range(ep_rank() * per_rank, (ep_rank() + 1) * per_rank))  # global experts held here
        self.expert_map: Optional[torch.Tensor] = None  # EP: global expert -> index here, -1 if elsewhere
        if ep_size() > 1:
            self.expert_map = torch.full((self.num_experts,), -1, dtype=torch.long)
            self.expert_map[self.expert_ids] = torch.arange(per_rank)
        self.gate = router
        shard = intermediate_size // self.slices
        self.w13 = nn.Parameter(torch.empty(len(self.expert_ids), 2 * shard, hidden_size), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(len(self.expert_ids), hidden_size, shard), requires_grad=False)
        self.w13.weight_loader = self.w2.weight_loader = self.weight_loader
        # per-channel scales of fp8 experts, group scales (and zeros, or a code book) of 4-bit
        # ones (the quant plugin's methods set them)
        self.register_parameter("w13_scale", None)
        self.register_parameter("w2_scale", None)
        self.register_parameter("w13_zero", None)
        self.register_parameter("w2_zero", None)
        self.register_parameter("book", None)
        self.shared_experts = shared_experts
        self.kernels = current_kernels()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if experts_over_replicas():
            out = self._routed_over_replicas(hidden)
        elif use_expert_all_to_all(hidden.shape[0]):
            out = self._routed_all_to_all(hidden)
        else:
            return self._routed_here(hidden)
        return out if self.shared_experts is None else out + self.shared_experts(hidden)

    def _routed_here(self, hidden: torch.Tensor) -> torch.Tensor:
        """Every token's routes to this rank's experts, the ranks' parts summed. On one rank the
        shared experts' output joins the pass that sums the routed rows; over ranks it is added
        after the all-reduce (the shared MLP reduces its own). Where the down GEMM sums the rows
        itself (one pair a block: small decode batches) the shared experts run beside router and
        routed experts (``platforms.side_stream``: on a second CUDA stream; one rank, so no
        collective runs there) and join that GEMM, which adds their output."""
        if self.shared_experts is not None and tp_size() == 1:
            if self._one_pair_a_block(hidden.shape[0] * self.gate.top_k):
                return run_beside(lambda: self.shared_experts(hidden),
                                  lambda shared: self._local_experts(hidden, *self._routes(hidden), addend=shared),
                                  hidden)
            return self._local_experts(hidden, *self._routes(hidden), addend=self.shared_experts(hidden))
        pair_rows = self.leaves_pair_sum and self.shared_experts is None and tp_size() == 1
        out = all_reduce(self._local_experts(hidden, *self._routes(hidden), pair_rows))
        return out if self.shared_experts is None else out + self.shared_experts(hidden)

    def _routes(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        topk_weights, topk_ids = self.gate(hidden)
        if self.expert_map is not None:
            topk_weights, topk_ids = local_routes(topk_weights, topk_ids, self.expert_map)
        return topk_weights, topk_ids

    def _one_pair_a_block(self, pairs: int) -> bool:
        """Whether the kernels run this many routes one pair a block (their down GEMM sums a token's pairs)."""
        kernels = self.kernels
        return kernels is not None and hasattr(kernels, "one_pair_a_block") and kernels.one_pair_a_block(
            pairs, self.w13.shape[0])

    def _local_experts(self, hidden: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                       pair_rows: bool = False,
                       addend: Union[torch.Tensor, Callable[[], torch.Tensor], None] = None) -> torch.Tensor:
        """Routes given as indices into this rank's experts, weighted and summed (or, with
        ``pair_rows``, possibly left unsummed: ``fused_experts``), plus ``addend`` if given."""
        return fused_experts(hidden, self.w13, self.w2, topk_weights, topk_ids, self.activation, self.w13_scale,
                             self.w2_scale, self.kernels, self.w13_zero, self.w2_zero, self.book, pair_rows, addend)

    def _routed_all_to_all(self, hidden: torch.Tensor) -> torch.Tensor:
        """Expert parallelism by all-to-all: this rank routes its share of the replicated tokens,
        dispatches them to the experts' ranks, and the shares are gathered back on every rank."""
        share = hidden[token_share(hidden.shape[0], ep_rank(), ep_size())]
        topk_weights, topk_ids = self.gate(share)
        out = dispatch_combine(share, topk_weights, topk_ids, len(self.expert_ids), self._local_experts, tp_group())
        return all_gather_rows(out, hidden.shape[0], tp_group())

    def _routed_over_replicas(self, hidden: torch.Tensor) -> torch.Tensor:
        """Data-parallel attention: every replica's tokens through this rank's experts, the parts
        summed over the replicas (one all-reduce), this replica's rows kept. Padding rows of a
        padded step route to local expert 0 with weight 0 (as routes to other ranks' experts do):
        they change no sum and read no other expert's weights."""
        context = get_forward_context()
        tokens, mine = gather_replica_tokens(hidden, context.replica_tokens)
        topk_weights, topk_ids = local_routes(*self.gate(tokens), self.expert_map)
        if context.replica_padding is not None:
            padding = context.replica_padding
            topk_weights, topk_ids = topk_weights.masked_fill(padding, 0.0), topk_ids.masked_fill(padding, 0)
        out = self._local_experts(tokens, topk_weights, topk_ids)
        dist.all_reduce(out)
        return out[mine]

    # ---- loading ----------------------------------------------------------------------------
    def checkpoint_shapes(self, param: nn.Parameter) -> list[tuple[object, tuple[int, ...]]]:
        """``(shard_id, unsharded shape)`` of the checkpoint tensors ``param`` loads (dummy weights)."""
        experts, hidden, shard = self.num_experts, self.w2.shape[1], self.w2.shape[2] * self.slices
        if param is self.w13:
            return [("gate_up", (experts, 2 * shard, hidden))]
        return [("down", (experts, hidden, shard))]

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object) -> None:
        """``shard_id``: ``(expert, "gate" | "up" | "down")`` for one expert's HF tensor, or
        ``"gate_up"`` / ``"down"`` for all experts stacked (transformers 5's in-memory layout)."""
        if shard_id == "gate_up":
            for expert, tensor in enumerate(loaded):
                gate, up = tensor.chunk(2, dim=0)
                self._load_expert(param, gate, expert, "gate")
                self._load_expert(param, up, expert, "up")
        elif shard_id == "down":
            for expert, tensor in enumerate(loaded):
                self._load_expert(param, tensor, expert, "down")
        else:
            self._load_expert(param, loaded, *shard_id)

    def _load_expert(self, param: nn.Parameter, loaded: torch.Tensor, expert: int, proj: str) -> None:
        # the slice widths come from the target: weights, packed 4-bit codes and group scales alike
        if expert not in self.expert_ids:
            return
        target = param.data[expert - self.expert_ids[0]]
        if proj == "down":  # sliced by input columns; a per-output-channel scale is whole on every rank
            width = target.shape[1] if target.dim() > 1 else 0
            target.copy_(loaded.narrow(1, self.slice_rank * width, width) if width else loaded)
        else:
            rows = target.shape[0] // 2
            offset = 0 if proj == "gate" else rows
            target.narrow(0, offset, rows).copy_(loaded.narrow(0, self.slice_rank * rows, rows))

    def expect_checkpoint_tensor(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        """Make ``name`` (``w13``, ``w2`` or their ``_scale`` / ``_zero``) an empty parameter that
        this layer's loader fills: a quantizer's expert format, read from a pre-quantized checkpoint."""
        param = nn.Parameter(torch.empty(shape, dtype=dtype, device=self.w13.device), requires_grad=False)
        param.weight_loader = self.weight_loader
        setattr(self, name, param)

    def checkpoint_tensors(self, prefix: str, leaf: str,
                           projections: tuple[str, str, str] = EXPERT_PROJECTIONS) -> dict[str, torch.Tensor]:
        """Parameter ``leaf`` under the checkpoint's names, the loader's inverse (one process): ``w13`` ->
        ``{prefix}.experts.{e}.gate_proj.weight`` and ``up_proj``, ``w2`` -> ``down_proj`` (or the
        model's own ``projections``); a quantized format's ``w13_scale`` / ``w13_zero`` ->
        ``...gate_proj.weight_scale`` / ``weight_zero``."""
        stacked, _, kind = leaf.partition("_")
        tensor = getattr(self, leaf).data
        if stacked not in ("w13", "w2"):
            return {f"{prefix}.{leaf}": tensor}
        suffix = f"weight_{kind}" if kind else "weight"
        gate, up, down = projections
        tensors = {}
        for expert, weights in zip(self.expert_ids, tensor):
            parts = {down: weights} if stacked == "w2" else dict(zip((gate, up), weights.chunk(2, dim=0)))
            tensors.update({f"{prefix}.experts.{expert}.{proj}.{suffix}": part for proj, part in parts.items()})
        return tensors


_TARGETS = (("w13", "gate"), ("w13", "up"), ("w2", "down"))  # of the gate, up and down projections
_STACKED = {".experts.gate_up_proj": ("w13", "gate_up"), ".experts.down_proj": ("w2", "down")}


def expert_checkpoint_target(name: str, projections: tuple[str, str, str] = EXPERT_PROJECTIONS
                             ) -> Optional[tuple[str, object]]:
    """The ``FusedMoE`` parameter and shard id of an HF expert tensor, or None for other tensors.

    ``model.layers.1.mlp.experts.7.up_proj.weight`` -> ``(model.layers.1.mlp.w13, (7, "up"))``;
    a model's own ``projections`` (Mixtral's ``w1``/``w3``/``w2``), transformers 5's stacked
    ``experts.gate_up_proj``, and quantized experts' ``weight_scale`` / ``weight_zero``
    (``...up_proj.weight_scale`` -> ``mlp.w13_scale``) too.
    """
    match = re.search(rf"\.experts\.(\d+)\.({'|'.join(projections)})\.weight(_scale|_zero)?$", name)
    if match:
        param, proj = _TARGETS[projections.index(match[2])]
        return f"{name[:match.start()]}.{param}{match[3] or ''}", (int(match[1]), proj)
    for suffix, (param, shard_id) in _STACKED.items():
        if name.endswith(suffix):
            return f"{name[:-len(suffix)]}.{param}", shard_id
    return None


def _load_reshaped(param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
    param.data.copy_(loaded.reshape(param.shape))
