"""A forward step survives the trip to a worker: the fields rank 0 packed (token ids: their shape,
the values come by broadcast), with the same dtypes, shapes and alignment, after pickling."""

from __future__ import annotations

import pickle
from dataclasses import fields

import torch

from fastllm.executor.step_wire import decode_forward, encode_forward
from fastllm.sampling_params import SamplingParams
from fastllm.worker.input_batch import ScheduledRow, SequenceState, pack_inputs


def _step():
    """A decode beside a 3-token prefill chunk, 4-token blocks."""
    params = SamplingParams(max_tokens=4)
    decode = SequenceState(0, "a", 0, [11, 12, 13, 14, 15, 16, 17], params, 0, block_ids=[1, 4],
                           num_computed_tokens=6)
    chunk = SequenceState(1, "b", 0, [21, 22, 23, 24, 25], params, 0, block_ids=[3], num_computed_tokens=0)
    return pack_inputs([ScheduledRow(chunk, 3), ScheduledRow(decode, 1)], 4, torch.device("cpu"))


def test_forward_step_round_trip():
    inputs = _step()
    wire = pickle.loads(pickle.dumps(encode_forward(inputs.host)))
    ids, positions, got, multimodal = decode_forward(wire, torch.device("cpu"))
    assert ids.shape == inputs.input_ids.shape and ids.dtype == inputs.input_ids.dtype
    assert torch.equal(positions, inputs.positions) and multimodal is None
    assert got.query_lens_cpu == [1, 3] and got.seq_lens_cpu == [7, 3] and got.num_decodes == 1
    sent_meta = inputs.attn_metadata
    for field in fields(sent_meta):
        sent, received = getattr(sent_meta, field.name), getattr(got, field.name)
        if isinstance(sent, torch.Tensor):
            assert received.dtype == sent.dtype and torch.equal(received, sent), field.name
            assert received.data_ptr() % 16 == 0, field.name  # as the kernels were specialised
        else:
            assert received == sent, field.name


def test_multimodal_step_round_trip():
    from fastllm.multimodal.inputs import StepMultimodal

    sent = StepMultimodal(positions=torch.tensor([[0, 1, 2], [0, 2, 3], [0, 3, 4], [5, 6, 7]]),
                          rows=torch.tensor([1]), embeds=torch.randn(1, 4))
    wire = pickle.loads(pickle.dumps(encode_forward(_step().host, sent)))
    received = decode_forward(wire, torch.device("cpu"))[3]
    for field in fields(sent):
        a, b = getattr(sent, field.name), getattr(received, field.name)
        assert a.dtype == b.dtype and torch.equal(a, b), field.name
