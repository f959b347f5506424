"""FusedMoE: its routers against transformers' own, its expert computation against a per-token
float64 loop, and its loader on both HF expert layouts."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig
from transformers.models.ernie4_5_moe.modeling_ernie4_5_moe import Ernie4_5_MoeTopKRouter
from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

from fastllm.layers.fused import use_kernels
from fastllm.layers.fused_moe import FusedMoE, TopKRouter, expert_checkpoint_target, fused_experts_reference
from fastllm.models.mixtral import MixtralForCausalLM

E, H, I = 8, 16, 12


def _per_token(hidden, w13, w2, topk_weights, topk_ids):
    """Each token through each of its experts, one at a time, in float64."""
    out = torch.zeros(hidden.shape, dtype=torch.float64)
    for t in range(hidden.shape[0]):
        for weight, expert in zip(topk_weights[t].tolist(), topk_ids[t].tolist()):
            gate, up = (w13[expert].double() @ hidden[t].double()).chunk(2)
            out[t] += weight * (w2[expert].double() @ (torch.nn.functional.silu(gate) * up))
    return out


def test_experts_with_no_tokens_and_experts_shared_by_tokens():
    torch.manual_seed(0)
    hidden, w13, w2 = torch.randn(6, H), torch.randn(E, 2 * I, H) / 4, torch.randn(E, H, I) / 4
    # experts 1, 4, 6, 7 receive nothing; expert 3 serves five tokens, expert 5 every token
    topk_ids = torch.tensor([[3, 5], [5, 3], [0, 5], [3, 5], [5, 2], [3, 5]])
    topk_weights = torch.rand(6, 2)
    actual = fused_experts_reference(hidden, w13, w2, topk_weights, topk_ids)
    expected = _per_token(hidden, w13, w2, topk_weights, topk_ids)
    assert ((actual.double() - expected).norm() / expected.norm()).item() < 1e-6


def test_single_token_and_all_tokens_on_one_expert():
    torch.manual_seed(1)
    hidden, w13, w2 = torch.randn(4, H), torch.randn(E, 2 * I, H) / 4, torch.randn(E, H, I) / 4
    for topk_ids in (torch.tensor([[6]]), torch.full((4, 1), 2)):
        weights = torch.rand(topk_ids.shape)
        tokens = hidden[: topk_ids.shape[0]]
        actual = fused_experts_reference(tokens, w13, w2, weights, topk_ids)
        expected = _per_token(tokens, w13, w2, weights, topk_ids)
        assert ((actual.double() - expected).norm() / expected.norm()).item() < 1e-6


def _hf_config(model_type: str, **values):
    return AutoConfig.for_model(model_type, hidden_size=H, **values)


@pytest.mark.parametrize("case", ["ernie", "qwen3_norm", "qwen3_raw", "mixtral"])
def test_router_matches_transformers(case):
    torch.manual_seed(2)
    if case == "ernie":
        hf = Ernie4_5_MoeTopKRouter(_hf_config("ernie4_5_moe", moe_num_experts=E, moe_k=3))
        ours = TopKRouter(H, E, 3, score_correction_bias=True, norm_min=hf.norm_min, float32_logits=True)
        bias = torch.randn(1, E) / 4  # large enough to change which experts win
        hf.moe_statics.e_score_correction_bias.data.copy_(bias)
        ours.e_score_correction_bias.weight_loader(ours.e_score_correction_bias, bias)
    elif case.startswith("qwen3"):
        norm = case == "qwen3_norm"
        hf = Qwen3MoeTopKRouter(_hf_config("qwen3_moe", num_experts=E, num_experts_per_tok=3, norm_topk_prob=norm))
        ours = TopKRouter(H, E, 3, renormalize=norm)
    else:
        hf = MixtralTopKRouter(_hf_config("mixtral", num_local_experts=E, num_experts_per_tok=2))
        ours = TopKRouter(H, E, 2)
    weight = torch.randn(E, H)
    hf.weight.data.copy_(weight)
    ours.weight.data.copy_(weight)
    hidden = torch.randn(32, H)
    _, hf_weights, hf_ids = hf(hidden)
    weights, ids = ours(hidden)
    assert torch.equal(ids, hf_ids)
    assert torch.equal(weights, hf_weights.float())


@pytest.mark.parametrize("rows", [1, 128])
def test_float32_router_on_bfloat16_rows_equals_the_float32_product(rows):
    """ERNIE's float32 router with the kernels, on bfloat16 rows: the weight's bfloat16 terms (on a
    GPU one 16-bit GEMM with float32 output, at one row the GEMV), summed by the routing kernel."""
    fastllm_kernels = pytest.importorskip("fastllm_kernels")
    torch.manual_seed(3)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    hidden_size = 2048  # a real model's accumulation length
    with use_kernels(fastllm_kernels), torch.device(device):
        router = TopKRouter(hidden_size, E, 3, score_correction_bias=True, float32_logits=True)
    weight = torch.randn(E, hidden_size) / 20
    router.weight.weight_loader(router.weight, weight.to(device))
    assert router.weight_terms is not None
    hidden = torch.randn(rows, hidden_size, device=device).to(torch.bfloat16)
    weights, ids = router(hidden)
    expected = torch.nn.functional.linear(hidden.double(), weight.double().to(device))
    probs = torch.softmax(expected, dim=-1)
    assert torch.equal(ids.sort(dim=-1).values, probs.topk(3, dim=-1).indices.sort(dim=-1).values)
    picked = probs.gather(-1, ids.long())
    error = ((weights.double() - picked / picked.sum(-1, keepdim=True)).abs() / picked).max().item()
    # float32-class: tensor cores accumulate a little less exactly than a float32 GEMM (a few 1e-6
    # of the largest logit against ~1e-6); bfloat16 logits would be off by some 1e-3
    assert error < 1e-4


@pytest.mark.parametrize("stacked", [False, True])
def test_loader_reads_per_expert_and_stacked_layouts(stacked):
    torch.manual_seed(3)
    gate, up, down = torch.randn(E, I, H), torch.randn(E, I, H), torch.randn(E, H, I)
    layer = FusedMoE(TopKRouter(H, E, 2), I)
    params = {"mlp." + name: p for name, p in layer.named_parameters()}
    if stacked:
        checkpoint = {"mlp.experts.gate_up_proj": torch.cat([gate, up], dim=1), "mlp.experts.down_proj": down}
    else:
        checkpoint = {f"mlp.experts.{e}.{proj}.weight": tensor[e] for e in range(E)
                      for proj, tensor in (("gate_proj", gate), ("up_proj", up), ("down_proj", down))}
    for name, tensor in checkpoint.items():
        target, shard_id = expert_checkpoint_target(name)
        params[target].weight_loader(params[target], tensor, shard_id)
    assert torch.equal(layer.w13, torch.cat([gate, up], dim=1))
    assert torch.equal(layer.w2, down)


def test_mixtral_names_map_to_the_stacked_weights():
    mixtral = MixtralForCausalLM.expert_projections
    assert expert_checkpoint_target("model.layers.0.mlp.experts.5.w3.weight", mixtral) == \
        ("model.layers.0.mlp.w13", (5, "up"))
    assert expert_checkpoint_target("model.layers.0.mlp.experts.5.w2.weight", mixtral) == \
        ("model.layers.0.mlp.w2", (5, "down"))
    assert expert_checkpoint_target("model.layers.0.mlp.experts.5.w2.weight") is None  # not HF's names
    assert expert_checkpoint_target("model.layers.0.mlp.shared_experts.up_proj.weight") is None


@pytest.mark.parametrize("method", ["int4", "nf4"])
def test_four_bit_experts_reference_and_kernel_agree_near_the_float_layer(method):
    """The quant plugin's 4-bit experts: the torch reference's dequantization and the grouped
    kernel (under the interpreter) compute the same layer, close to the float one."""
    from fastllm_kernels import fused_experts as kernel_fused_experts
    from fastllm_kernels.quant import NF4_CODES
    from fastllm_quant.experts import quantize_four_bit_experts
    from fastllm_quant.int4 import quantize_int4
    from fastllm_quant.nf4 import quantize_nf4

    torch.manual_seed(0)
    moe = FusedMoE(TopKRouter(64, E, 2), 32)
    moe.w13.data, moe.w2.data = torch.randn(E, 64, 64) / 8, torch.randn(E, 64, 32) / 6
    hidden = torch.randn(9, 64)
    topk_weights, topk_ids = torch.rand(9, 2).softmax(-1), torch.randint(0, E - 2, (9, 2))  # two experts idle
    topk_ids[0, 1] = topk_ids[0, 0]
    float_out = fused_experts_reference(hidden, moe.w13, moe.w2, topk_weights, topk_ids)
    group = 32 if method == "int4" else 16
    if method == "int4":
        quantize_four_bit_experts(moe, quantize_int4, group)
    else:
        quantize_four_bit_experts(moe, quantize_nf4, group, NF4_CODES)
    formats = {"w13_scale": moe.w13_scale, "w2_scale": moe.w2_scale, "book": moe.book,
               "w13_zero": moe.w13_zero, "w2_zero": moe.w2_zero}

    reference = fused_experts_reference(hidden, moe.w13, moe.w2, topk_weights, topk_ids, "silu", **formats)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter takes CPU tensors, a GPU its own
    kernel = kernel_fused_experts(*(t.to(device) for t in (hidden, moe.w13, moe.w2, topk_weights, topk_ids)),
                                  **{name: value.to(device) for name, value in formats.items() if value is not None})
    kernel = kernel.cpu()

    assert moe.w13.dtype == torch.uint8 and moe.w13.shape == (E, 64, 32) and moe.w13_scale.shape == (E, 64, 64 // group)
    assert ((kernel - reference).norm() / reference.norm()).item() < 1e-5
    assert ((reference - float_out).norm() / float_out.norm()).item() < 0.15
