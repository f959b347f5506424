"""Lookahead drafts on guided requests: each draft is checked against the request's grammar, each
draft row is masked by the grammar after the drafts before it, so the output is the same token
for token as without drafts (greedy and seeded sampling, xgrammar and llguidance), and a request
that copies from its prompt takes several tokens a step."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from fastllm import LLM, SamplingParams
from fastllm.engine.sequence import Sequence
from fastllm.structured_output.drafts import apply_grammar_masks, clip_drafts
from fastllm.sampling_params import GuidedDecodingParams

pytest.importorskip("fastllm_xgrammar")
pytest.importorskip("fastllm_llguidance")

DOCUMENT = ("Ada Price was born in Port Selby in 1887, the youngest of five children. She kept the ledger "
            "of every ship that entered the harbour, and her green books are still held in the town museum.")
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "town": {"type": "string"},
                                           "year": {"type": "integer"}, "books": {"type": "string"}},
          "required": ["name", "town", "year", "books"], "additionalProperties": False}
PROMPT = ("<|im_start|>user\nRead the text and answer in JSON with the keys name, town, year and books "
          f"(where her books are, quoted from the text).\n\n{DOCUMENT}<|im_end|>\n<|im_start|>assistant\n")
SPEC = {"method": "lookahead", "num_speculative_tokens": 6}


@pytest.fixture(scope="module", params=["xgrammar", "llguidance"])
def engines(request, smollm2_path) -> tuple[LLM, LLM]:
    common = {"max_model_len": 1024, "num_gpu_blocks_override": 64, "structured_output_backend": request.param}
    return LLM(smollm2_path, **common), LLM(smollm2_path, speculative_config=SPEC, **common)


def test_greedy_output_is_the_same_with_drafts(engines):
    params = SamplingParams(temperature=0.0, max_tokens=64, guided_decoding={"json": SCHEMA})
    plain, lookahead = (llm.generate([PROMPT], params, use_tqdm=False)[0] for llm in engines)
    assert lookahead.outputs.token_ids == plain.outputs.token_ids
    assert lookahead.metrics.num_accepted_tokens > 0, "no draft held: the test says nothing"
    assert len(lookahead.outputs.token_ids) / lookahead.metrics.num_spec_steps > 1.5
    if plain.outputs.finish_reason == "stop":
        jsonschema.validate(json.loads(plain.outputs.text), SCHEMA)


def test_seeded_sampling_is_the_same_with_drafts(engines):
    params = [SamplingParams(seed=seed, max_tokens=48, guided_decoding={"json": SCHEMA}, **settings)
              for seed, settings in ((2, {"temperature": 1.0, "top_p": 0.9}), (3, {"temperature": 0.5, "top_k": 10}))]
    plain, lookahead = (llm.generate([PROMPT] * len(params), params, use_tqdm=False) for llm in engines)
    for p, la in zip(plain, lookahead):
        assert la.outputs.token_ids == p.outputs.token_ids
    assert sum(o.metrics.num_accepted_tokens for o in lookahead) > 0
    assert len({tuple(o.outputs.token_ids) for o in plain}) > 1


@pytest.mark.parametrize("name", ["xgrammar", "llguidance"])
def test_drafts_are_clipped_and_draft_rows_masked_after_the_drafts_before_them(smollm2_llm, name):
    from fastllm import registry

    engine = smollm2_llm.engine
    backend = registry.get("structured_output_backends", name)(engine.tokenizer, engine.hf_config.vocab_size)
    compiled = backend.compile(GuidedDecodingParams(json=SCHEMA))
    tokens = engine.tokenizer.encode('{"name": "Ada Price", "town"', add_special_tokens=False)
    seq = Sequence("r", 0, [1], SamplingParams(), frozenset([engine.tokenizer.eos_token_id]), 64)
    seq.structured_state = backend.new_matcher(compiled)
    seq.draft_token_ids = tokens[:3] + engine.tokenizer.encode("}", add_special_tokens=False) + tokens[3:]
    clip_drafts(backend, [seq], frozenset([engine.tokenizer.eos_token_id]))
    assert seq.draft_token_ids == tokens[:3]  # '{"name":' then "}" is refused: it and all after it go
    seq.draft_token_ids = tokens
    vocab = engine.hf_config.vocab_size
    logits = torch.zeros(len(tokens) + 1, vocab)
    apply_grammar_masks(backend, logits, [seq.seq_id] * len(logits), {seq.seq_id: seq.structured_state},
                        {seq.seq_id: tokens})
    for depth in range(len(logits)):  # a fresh matcher advanced by hand through the same drafts
        expected, reference = torch.zeros(1, vocab), backend.new_matcher(compiled)
        assert backend.accept_prefix(reference, tokens[:depth]) == depth
        backend.apply_bitmask(expected, [reference])
        assert torch.equal(torch.isinf(logits[depth]), torch.isinf(expected[0])), depth
    again = torch.zeros(1, vocab)  # the sequence's own matcher is back at the start
    backend.apply_bitmask(again, [seq.structured_state])
    assert torch.equal(torch.isinf(again[0]), torch.isinf(logits[0]))
