"""Weight bytes and parameter counts on hand-built modules; the device rates on CPU."""

from __future__ import annotations

import torch
from torch import nn

from fastllm.bench.device_rates import copy_bandwidth, matmul_flops
from fastllm.bench.model_size import active_weight_bytes, num_active_parameters, num_parameters, weight_bytes


def test_weight_bytes_counts_parameters_buffers_and_tied_tensors_once():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=True)).to(torch.bfloat16)
    model[0].register_buffer("table", torch.zeros(3, dtype=torch.float32))
    assert num_parameters(model) == 40 + 40 + 10
    assert weight_bytes(model) == 2 * (40 + 40 + 10) + 4 * 3
    model[1].weight = model[0].weight  # tied: read once per step
    assert num_parameters(model) == 40 + 10 and weight_bytes(model) == 2 * (40 + 10) + 4 * 3


def test_device_rates_are_positive_on_cpu():
    cpu = torch.device("cpu")
    assert copy_bandwidth(cpu, nbytes=2**20, reps=2) > 0
    assert matmul_flops(cpu, n=64, dtype=torch.float32, reps=2) > 0


def test_active_counts_leave_out_the_experts_a_token_does_not_route_to():
    from fastllm.layers.fused_moe import FusedMoE, TopKRouter

    model = nn.Sequential(nn.Linear(4, 4, bias=False), FusedMoE(TopKRouter(4, 8, 2), 6)).to(torch.bfloat16)
    experts = 8 * (2 * 6 * 4 + 4 * 6)
    total = 16 + 8 * 4 + experts  # dense linear, router, experts
    assert num_parameters(model) == total
    assert num_active_parameters(model) == total - experts * 6 // 8
    assert active_weight_bytes(model) == 2 * (total - experts * 6 // 8)
