"""The output processor: a request's deltas add up to its cumulative outputs, and stop strings,
reasoning and tool calls come out the same whether the text arrives token by token or at once."""

from __future__ import annotations

import pytest

from fastllm import SamplingParams, registry
from fastllm.chat import tool_parser
from fastllm.engine.output_deltas import DeltaDecoder
from fastllm.engine.output_processor import OutputKind, OutputProcessor
from fastllm.engine.sequence import Sequence

FIELDS = ("index", "send_idx", "token_ids", "text", "reasoning_content", "finish_reason", "stop_reason")


@pytest.fixture(scope="module")
def tokenizer(smollm2_llm):
    return smollm2_llm.tokenizer


def completions(output) -> list[tuple]:
    return [tuple(getattr(c, name) for name in FIELDS) for c in output.completions]


def feed(processor: OutputProcessor, tokenizer, text: str, params: SamplingParams, kind: OutputKind,
         tool_call_parser: str | None = None) -> list:
    """Hand the tokens of ``text`` to the processor one at a time, as the engine does; every
    output it emits, deltas decoded back into outputs."""
    seq = Sequence("r", 0, tokenizer.encode("Say:"), params, frozenset([tokenizer.eos_token_id]), 512)
    state = processor.new_request("r", "Say:", [seq], 0.0, True, kind, tool_call_parser)
    decoder, outputs = DeltaDecoder("r", 0.0), []
    for token in tokenizer.encode(text):
        seq.append_token(token)
        processor.check_token(seq)
        processor.detokenize(state, state.samples[0], [token])
        output = processor.emit(state)
        if output is not None:
            outputs.append(decoder.decode(output.payload) if kind is OutputKind.DELTA else output)
        if state.finished:
            break
    return outputs


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_string_across_tokens_ends_the_text_and_never_leaks(tokenizer, include):
    params = SamplingParams(max_tokens=64, stop=["forty-two", "never"], include_stop_str_in_output=include)
    processor = OutputProcessor(tokenizer)
    text = "The answer is forty-two, said the machine."
    streamed = feed(processor, tokenizer, text, params, OutputKind.DELTA)
    cumulative = feed(processor, tokenizer, text, params, OutputKind.CUMULATIVE)
    assert [completions(o) for o in streamed] == [completions(o) for o in cumulative]
    final = streamed[-1].outputs
    assert final.text == ("The answer is forty-two" if include else "The answer is ")
    assert (final.finish_reason, final.stop_reason, streamed[-1].finished) == ("stop", "forty-two", True)
    assert len(final.token_ids) < len(tokenizer.encode(text))  # the tokens after the stop never came
    assert all(final.text.startswith(o.outputs.text) for o in streamed)  # no held-back text was shown
    only = feed(processor, tokenizer, text, params, OutputKind.FINAL_ONLY)
    assert [completions(o) for o in only] == [completions(cumulative[-1])]


def test_streamed_reasoning_equals_the_one_shot_split(tokenizer):
    parser_cls = registry.get("reasoning_parsers", "qwen3")
    text = "<think>\nFirst I add, then I check.\n</think>\n\nThe sum is 4."
    params = SamplingParams(max_tokens=len(tokenizer.encode(text)), skip_special_tokens=False)
    streamed = feed(OutputProcessor(tokenizer, parser_cls), tokenizer, text, params, OutputKind.DELTA)
    reasoning, content = parser_cls(tokenizer).extract(text)
    final = streamed[-1].outputs
    assert (final.reasoning_content, final.text, final.finish_reason) == (reasoning, content, "length")
    assert reasoning and content
    assert all(reasoning.startswith(o.outputs.reasoning_content) and content.startswith(o.outputs.text)
               for o in streamed)


def test_tool_calls_are_split_alike_in_every_output_kind(tokenizer):
    """A request naming a tool parser: cumulative, final-only and delta-rebuilt outputs carry the
    calls the parser finds in the whole text at once, and only the rest as text; streamed, the
    calls only grow and each keeps the id it came with."""
    text = 'Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    params = SamplingParams(max_tokens=len(tokenizer.encode(text)))
    expected = tool_parser("hermes", tokenizer).extract(text)
    assert expected.tool_calls and expected.content == "Let me check. "

    def shown(output) -> tuple:
        return output.outputs.text, [(call.name, call.arguments) for call in output.outputs.tool_calls]

    runs = {kind: feed(OutputProcessor(tokenizer), tokenizer, text, params, kind, "hermes") for kind in OutputKind}
    assert [shown(o) for o in runs[OutputKind.DELTA]] == [shown(o) for o in runs[OutputKind.CUMULATIVE]]
    for outputs in runs.values():
        assert shown(outputs[-1]) == (expected.content, [(c.name, c.arguments) for c in expected.tool_calls])
    streamed = runs[OutputKind.DELTA]
    assert len(streamed) > 2 and streamed[0].outputs.tool_calls == []
    (call,) = streamed[-1].outputs.tool_calls
    assert call.id.startswith("call_") and all(c.id == call.id for o in streamed for c in o.outputs.tool_calls)
    plain = feed(OutputProcessor(tokenizer), tokenizer, text, params, OutputKind.CUMULATIVE)
    assert (plain[-1].outputs.text, plain[-1].outputs.tool_calls) == (text, None)


def test_the_engine_streams_deltas_equal_to_its_cumulative_outputs(smollm2_llm):
    """Both kinds in one engine, with n=2, a stop string and logprobs: every step's delta rebuilds
    the cumulative output of that step, and the final-only request gets the same last output."""
    engine = smollm2_llm.engine
    prompt = "The capital of France is"
    probe = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    text = smollm2_llm.generate(prompt, probe, use_tqdm=False)[0].outputs.text
    params = SamplingParams(n=2, temperature=0, max_tokens=12, ignore_eos=True, logprobs=1,
                            stop=[text[len(text) // 2:len(text) // 2 + 4]])
    kinds = {"c": OutputKind.CUMULATIVE, "d": OutputKind.DELTA, "f": OutputKind.FINAL_ONLY}
    for request_id, kind in kinds.items():
        engine.add_request(request_id, prompt, None, params, output_kind=kind)
    decoder, outputs = DeltaDecoder("d", 0.0), {request_id: [] for request_id in kinds}
    while engine.has_unfinished_requests():
        for output in engine.step():
            outputs[output.request_id].append(decoder.decode(output.payload) if output.request_id == "d" else output)
    cumulative, streamed, (final,) = outputs["c"], outputs["d"], outputs["f"]
    assert [completions(o) for o in streamed] == [completions(o) for o in cumulative]
    def logprobs(outputs):  # the requests share batches: values equal up to float noise
        return [[value for c in o.completions for step in c.logprobs for value in step.items()] for o in outputs]

    for got, want in zip(logprobs(streamed), logprobs(cumulative), strict=True):
        assert [token for token, _ in got] == [token for token, _ in want]
        assert [value for _, value in got] == pytest.approx([value for _, value in want], rel=1e-4)
    assert completions(final) == completions(cumulative[-1]) and final.finished and streamed[-1].finished
    assert final.outputs.finish_reason == "stop" and len(final.outputs.text) < len(text)


def test_deltas_send_the_prompt_ids_only_where_the_engine_made_them(smollm2_llm):
    """The delta consumer (the engine-core front end) has the token ids it sent: the first delta
    of such a request carries none, a text-only request's carries what the engine tokenized."""
    engine = smollm2_llm.engine
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    engine.add_request("ids", "Hello there", [5, 6, 7], params, output_kind=OutputKind.DELTA)
    engine.add_request("text", "Hello there", None, params, output_kind=OutputKind.DELTA)
    deltas: dict[str, list] = {"ids": [], "text": []}
    while engine.has_unfinished_requests():
        for output in engine.step():
            deltas[output.request_id].append(output.payload)
    assert [delta[0] for delta in deltas["ids"]] == [None, None]
    assert [delta[0] for delta in deltas["text"]] == [engine.inputs.tokenize("Hello there"), None]
