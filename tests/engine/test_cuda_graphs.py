"""Decode through the CUDA-graph buffers: padded batches must not change a token.

CPUs have no CUDA graphs, so here the graphs are never captured and ``run`` runs the same forward
eagerly over the static, padded buffers: what is checked is everything around the capture
(padding rows that write no slot, the size ladder, copying each step into the buffers, slicing
the output).
"""

from __future__ import annotations

import random

from fastllm import LLM, SamplingParams
from fastllm.platforms.cuda_graphs import DecodeGraphs, capture_sizes


def _eager_graphs(runner, max_batch: int, max_query_len: int = 1) -> DecodeGraphs:
    graphs = DecodeGraphs(runner._eager_forward, max_batch, 8, 128, runner.device, max_query_len, runner.adapters)
    runner.graphs = graphs
    return graphs


def test_capture_sizes_cover_every_batch():
    assert capture_sizes(1) == [1]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert capture_sizes(256)[-1] == 256 and all(s % 8 == 0 for s in capture_sizes(256)[3:])


def test_padded_decode_graphs_keep_greedy_output(tiny_llama_dir):
    rng = random.Random(0)
    prompts = [{"prompt_token_ids": [rng.randrange(3, 256) for _ in range(rng.randrange(5, 40))]}
               for _ in range(7)]
    params = [SamplingParams(temperature=0.0, max_tokens=4 + 3 * i, ignore_eos=True) for i in range(7)]
    kwargs = dict(load_format="dummy", dtype="float32", block_size=16, max_model_len=128, max_num_seqs=6,
                  num_gpu_blocks_override=64, seed=0)
    eager = LLM(tiny_llama_dir, **kwargs)
    expected = [o.outputs.token_ids for o in eager.generate(prompts, params, use_tqdm=False)]

    llm = LLM(tiny_llama_dir, **kwargs)
    graphs = _eager_graphs(llm.engine.runner.runner, 6)
    replayed = []
    run = graphs.run
    graphs.run = lambda ids, pos, meta, *rest: replayed.append(meta.num_seqs) or run(ids, pos, meta, *rest)
    got = [o.outputs.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == expected
    assert replayed and set(replayed) - set(graphs.sizes), "no step ran a padded graph"


class _OracleDrafts:
    """A speculative decoder that knows the greedy answer: each step it proposes 0 to 4 of its
    next tokens, with a wrong one now and then, so verification steps of every shape occur."""

    def __init__(self, answers: dict[tuple[int, ...], list[int]]):
        self.answers = answers

    def on_prompt(self, seq) -> None:
        seq.spec_state = self.answers[tuple(seq.prompt_token_ids)]

    def propose(self, seqs, max_drafts) -> None:
        for seq, room in zip(seqs, max_drafts):
            done = len(seq.output_token_ids)
            drafts = seq.spec_state[done:done + min(room, (done + seq.seq_id) % 5)]
            if drafts and done % 3 == 0:
                drafts[-1] = (drafts[-1] + 1) % 256
            seq.draft_token_ids = drafts

    def on_step(self, seq, num_proposed: int, num_accepted: int) -> None:
        pass

    def on_finished(self, seq) -> None:
        pass


def test_verification_graphs_pad_short_queries_and_keep_greedy_output(tiny_llama_dir):
    """Steps with drafts replay the graph of their longest query; shorter queries are padded
    inside it. The triton backend (through Triton's interpreter here) reads only the device
    metadata, as a captured graph does, so padding that leaked into a real row would show."""
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 256) for _ in range(rng.randrange(5, 30))] for _ in range(3)]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (8, 14, 24)]
    kwargs = dict(load_format="dummy", dtype="float32", block_size=16, max_model_len=128, max_num_seqs=4,
                  num_gpu_blocks_override=32, seed=0, attention_backend="triton")
    plain = LLM(tiny_llama_dir, **kwargs)
    expected = [o.outputs.token_ids for o in plain.generate(
        [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)]

    llm = LLM(tiny_llama_dir, **kwargs)
    llm.engine.speculator = _OracleDrafts({tuple(p): e for p, e in zip(prompts, expected)})
    graphs = _eager_graphs(llm.engine.runner.runner, 4, max_query_len=5)
    shapes = []
    run = graphs.run
    graphs.run = lambda ids, pos, meta, *rest: shapes.append((meta.num_seqs, tuple(meta.query_lens_cpu))) or \
        run(ids, pos, meta, *rest)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs.token_ids for o in outputs] == expected
    assert sum(o.metrics.num_accepted_tokens for o in outputs) > 0
    assert any(len(set(lens)) > 1 and max(lens) > 1 for _, lens in shapes), "no step padded a query"
    assert any(n == 1 and lens[0] > 1 for n, lens in shapes), "no single-sequence verification step"
    assert any(n == 3 for n, _ in shapes), "no step padded the batch"


def test_warm_up_runs_every_query_length_class_beside_a_decode(tiny_llama_dir):
    """The CUDA warm-up's steps, run here: a decode plus an extend of each power-of-two length
    that fits a step of the engine's token budget beside the decode (and the KV pool), then a
    full step of 16 sequences where the pool holds it."""
    from fastllm import LLM

    llm = LLM(tiny_llama_dir, load_format="dummy", max_model_len=256, block_size=16, num_gpu_blocks_override=32)
    runner, seen = llm.engine.runner.runner, []
    forward = runner._eager_forward

    def spy(input_ids, positions, meta):
        seen.append((meta.num_decodes, meta.query_lens_cpu, meta.seq_lens_cpu))
        return forward(input_ids, positions, meta)

    runner._eager_forward = spy
    runner.warm_up(llm.engine.max_num_batched_tokens)
    assert llm.engine.max_num_batched_tokens == 256
    full_step = (15, [1] * 15 + [241], [2] * 15 + [242])  # 256 tokens in 1 + 15 + 16 blocks
    assert seen == [(2 if n == 1 else 1, [1, n], [2, n + 1]) for n in (1, 2, 4, 8, 16, 32, 64, 128)] + [full_step]
    seen.clear()
    runner.num_blocks = 31  # the full step no longer fits
    runner.warm_up(256)
    assert seen[-1][1] == [1, 128]
    seen.clear()
    runner.warm_up(100)
    assert [query_lens[-1] for _, query_lens, _ in seen] == [1, 2, 4, 8, 16, 32, 64, 85]
