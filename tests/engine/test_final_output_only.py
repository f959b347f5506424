"""Offline generation asks the engine for final outputs only; streaming gets one a step."""

from __future__ import annotations

from fastllm import SamplingParams
from fastllm.engine.output_processor import OutputKind


def test_a_final_only_request_gets_one_output_equal_to_the_streamed_last(smollm2_llm):
    engine = smollm2_llm.engine
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompt = "The capital of France is"
    engine.add_request("streamed", prompt, None, params)
    engine.add_request("final", prompt, None, params, output_kind=OutputKind.FINAL_ONLY)
    outputs: dict[str, list] = {"streamed": [], "final": []}
    while engine.has_unfinished_requests():
        for output in engine.step():
            outputs[output.request_id].append(output)
    streamed, final = outputs["streamed"], outputs["final"]
    assert len(streamed) >= 12 and not any(out.finished for out in streamed[:-1])
    assert len(final) == 1 and final[0].finished
    last, only = streamed[-1].outputs, final[0].outputs
    assert (only.text, only.token_ids, only.finish_reason, only.send_idx) == \
        (last.text, last.token_ids, last.finish_reason, last.send_idx)
    assert len(only.token_ids) == 12 and only.text
