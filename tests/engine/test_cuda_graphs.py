"""Decode through the CUDA-graph buffers: padded batches must not change a token.

CPUs have no CUDA graphs, so here a "graph" replays the same forward eagerly over the static,
padded buffers: what is checked is everything around the capture (padding rows that write no
slot, the size ladder, copying each step into the buffers, slicing the output).
"""

from __future__ import annotations

import random

from fastllm import LLM, SamplingParams
from fastllm.engine.cuda_graphs import DecodeGraphs, capture_sizes


class _EagerReplay:
    """Stands in for a captured graph: runs the forward on the static buffers when replayed."""

    def __init__(self, graphs: DecodeGraphs, size: int):
        self.graphs, self.size = graphs, size

    def replay(self) -> None:
        g, size = self.graphs, self.size
        g.outputs[size] = g.forward(g.input_ids[:size], g.positions[:size], g._metadata(size))


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
    runner = llm.engine.runner.runner
    graphs = DecodeGraphs(runner._eager_forward, 6, 8, 128, runner.device)
    graphs.graphs = {size: _EagerReplay(graphs, size) for size in graphs.sizes}
    runner.graphs = graphs
    replayed = []
    run = graphs.run
    graphs.run = lambda ids, pos, meta: replayed.append(meta.num_seqs) or run(ids, pos, meta)
    got = [o.outputs.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == expected
    assert replayed and set(replayed) - set(graphs.sizes), "no step ran a padded graph"


def test_warm_up_runs_every_query_length_class_beside_a_decode(tiny_llama_dir):
    """The CUDA warm-up's steps, run here: a decode plus an extend of each power-of-two length."""
    from fastllm import LLM

    llm = LLM(tiny_llama_dir, load_format="dummy", max_model_len=256, block_size=16, num_gpu_blocks_override=16)
    runner, seen = llm.engine.runner.runner, []
    forward = runner._eager_forward

    def spy(input_ids, positions, meta):
        seen.append((meta.num_decodes, meta.query_lens_cpu, meta.seq_lens_cpu))
        return forward(input_ids, positions, meta)

    runner._eager_forward = spy
    runner.warm_up()
    assert seen == [(2 if n == 1 else 1, [1, n], [2, n + 1]) for n in (1, 2, 4, 8, 16, 32, 64, 128)]
