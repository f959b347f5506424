"""Weight bytes and parameter counts on hand-built modules; the device rates on CPU."""

from __future__ import annotations

import torch
from torch import nn

from fastllm.bench.device_rates import copy_bandwidth, matmul_flops
from fastllm.bench.model_size import num_parameters, weight_bytes
from fastllm.platforms.cpu import CpuPlatform


def test_weight_bytes_counts_parameters_buffers_and_tied_tensors_once():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=True)).to(torch.bfloat16)
    model[0].register_buffer("table", torch.zeros(3, dtype=torch.float32))
    assert num_parameters(model) == 40 + 40 + 10
    assert weight_bytes(model) == 2 * (40 + 40 + 10) + 4 * 3
    model[1].weight = model[0].weight  # tied: read once per step
    assert num_parameters(model) == 40 + 10 and weight_bytes(model) == 2 * (40 + 10) + 4 * 3


def test_device_rates_are_positive_on_cpu():
    cpu = CpuPlatform()
    assert copy_bandwidth(cpu, nbytes=2**20, reps=2) > 0
    assert matmul_flops(cpu, n=64, dtype=torch.float32, reps=2) > 0


def test_a_token_reads_its_k_experts_and_one_embedding_row():
    from fastllm.layers.embedding import ParallelLMHead, VocabParallelEmbedding
    from fastllm.layers.fused_moe import FusedMoE, TopKRouter

    vocab, hidden, experts, top_k, inner = 10, 4, 8, 2, 6
    model = nn.ModuleDict({"embed": VocabParallelEmbedding(vocab, hidden), "head": ParallelLMHead(vocab, hidden),
                           "moe": FusedMoE(TopKRouter(hidden, experts, top_k), inner)})
    router, routed = experts * hidden, experts * 3 * inner * hidden
    assert num_parameters(model) == hidden + vocab * hidden + router + routed * top_k // experts
    model["head"].weight = model["embed"].weight  # tied: the LM head reads the whole table
    assert num_parameters(model) == vocab * hidden + router + routed * top_k // experts
    assert weight_bytes(model) == 4 * num_parameters(model)


def test_layers_share_one_rotary_table_and_a_token_reads_one_row():
    from fastllm.layers.rotary import RotaryEmbedding

    layers = nn.ModuleList(RotaryEmbedding(8, 64, 10000.0) for _ in range(3))
    other = RotaryEmbedding(8, 64, 500.0)
    assert all(layer.cos_sin_cache is layers[0].cos_sin_cache for layer in layers)
    assert other.cos_sin_cache is not layers[0].cos_sin_cache
    freqs = torch.arange(64, dtype=torch.float32)[:, None] / 10000.0 ** (torch.arange(0, 8, 2) / 8)[None, :]
    torch.testing.assert_close(layers[1].cos_sin_cache, torch.cat([freqs.cos(), freqs.sin()], dim=-1))
    assert weight_bytes(layers) == 4 * 8  # one float32 row of the one shared table
