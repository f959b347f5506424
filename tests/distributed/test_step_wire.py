"""A forward step survives the trip to a worker: same values (token ids: shape), dtypes and shapes after pickling."""

from __future__ import annotations

import pickle
from dataclasses import fields

import torch

from fastllm.attention.metadata import AttentionMetadata
from fastllm.executor.step_wire import decode_forward, encode_forward


def test_forward_step_round_trip():
    meta = AttentionMetadata(
        slot_mapping=torch.tensor([70, 71, 5, 6, 7], dtype=torch.int64),
        query_start_loc=torch.tensor([0, 1, 2, 5], dtype=torch.int32),
        seq_lens=torch.tensor([7, 8, 3], dtype=torch.int32),
        block_tables=torch.tensor([[1, 4], [2, 0], [3, 0]], dtype=torch.int32),
        num_decodes=2, max_query_len=3, max_seq_len=8, query_lens_cpu=[1, 1, 3], seq_lens_cpu=[7, 8, 3])
    input_ids, positions = torch.tensor([11, 12, 13, 14, 15]), torch.tensor([6, 7, 0, 1, 2])
    wire = pickle.loads(pickle.dumps(encode_forward(input_ids, positions, meta)))
    ids, pos, got, multimodal = decode_forward(wire, torch.device("cpu"))
    assert ids.shape == input_ids.shape and ids.dtype == input_ids.dtype  # values come by broadcast
    assert torch.equal(pos, positions) and multimodal is None
    for field in fields(meta):
        sent, received = getattr(meta, field.name), getattr(got, field.name)
        if isinstance(sent, torch.Tensor):
            assert received.dtype == sent.dtype and torch.equal(received, sent), field.name
        else:
            assert received == sent, field.name


def test_multimodal_step_round_trip():
    from fastllm.multimodal.inputs import StepMultimodal

    meta = AttentionMetadata(
        slot_mapping=torch.tensor([5, 6], dtype=torch.int64), query_start_loc=torch.tensor([0, 2], dtype=torch.int32),
        seq_lens=torch.tensor([2], dtype=torch.int32), block_tables=torch.tensor([[1]], dtype=torch.int32),
        num_decodes=0, max_query_len=2, max_seq_len=2, query_lens_cpu=[2], seq_lens_cpu=[2])
    sent = StepMultimodal(positions=torch.tensor([[0, 1], [0, 2], [0, 3]]), rows=torch.tensor([1]),
                          embeds=torch.randn(1, 4))
    wire = pickle.loads(pickle.dumps(encode_forward(torch.tensor([1, 2]), torch.tensor([0, 1]), meta, sent)))
    received = decode_forward(wire, torch.device("cpu"))[3]
    for field in fields(sent):
        a, b = getattr(sent, field.name), getattr(received, field.name)
        assert a.dtype == b.dtype and torch.equal(a, b), field.name
