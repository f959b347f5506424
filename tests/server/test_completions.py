"""/v1/completions through the official openai client: outputs, streaming, sampling controls, usage."""

from __future__ import annotations

from tests.server.conftest import MODEL

PROMPT = "The capital of France is"


def test_greedy_completion_and_usage_add_up(client):
    response = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=1)
    choice = response.choices[0]
    assert response.object == "text_completion" and response.model == MODEL
    assert choice.text.startswith(" Paris")
    assert choice.finish_reason == "length"
    usage = response.usage
    assert usage.completion_tokens == 6 == len(choice.logprobs.tokens)
    assert usage.prompt_tokens == 5
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert "".join(choice.logprobs.tokens) == choice.text


def test_stream_matches_whole_response(client):
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_several_prompts_and_n_number_the_choices(client):
    response = client.completions.create(model=MODEL, prompt=["Hello", "The weather today is"], n=2, max_tokens=3,
                                         temperature=0.8, seed=1)
    assert sorted(c.index for c in response.choices) == [0, 1, 2, 3]
    assert response.usage.completion_tokens == 4 * 3
    assert response.usage.prompt_tokens == 1 + 4


def test_token_id_prompts(client):
    single = client.completions.create(model=MODEL, prompt=[504, 2988, 314], max_tokens=2, temperature=0)
    several = client.completions.create(model=MODEL, prompt=[[504, 2988, 314], [504]], max_tokens=2, temperature=0)
    assert single.usage.prompt_tokens == 3 and several.usage.prompt_tokens == 4
    assert several.choices[0].text == single.choices[0].text


def test_stream_with_n_sends_every_choice(client):
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, n=3, max_tokens=4, temperature=1.0,
                                            seed=3, stream=True))
    finished = {c.choices[0].index for c in chunks if c.choices[0].finish_reason}
    assert finished == {0, 1, 2}


def test_seed_makes_sampling_reproducible(client):
    def sample(seed: int) -> str:
        return client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=1.0,
                                         seed=seed).choices[0].text

    assert sample(1234) == sample(1234)
    assert len({sample(1), sample(2), sample(3)}) > 1


def test_stop_string_ends_the_text(client):
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0).choices[0].text
    stop = whole[7:10]  # a piece of what greedy decoding writes after " Paris"
    choice = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, stop=[stop]).choices[0]
    assert choice.finish_reason == "stop"
    assert choice.text == whole[:whole.index(stop)]
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, stop=stop, stream=True))
    assert streamed == choice.text


def test_echo_returns_prompt_first_with_prompt_logprobs(client):
    choice = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0, echo=True,
                                       logprobs=2).choices[0]
    assert choice.text.startswith(PROMPT) and len(choice.text) > len(PROMPT)
    assert len(choice.logprobs.tokens) == 5 + 2
    assert choice.logprobs.token_logprobs[0] is None and choice.logprobs.token_logprobs[1] < 0


def test_best_of_returns_n_choices(client):
    response = client.completions.create(model=MODEL, prompt=PROMPT, n=1, best_of=3, max_tokens=3, temperature=1.0,
                                         seed=5)
    assert len(response.choices) == 1
    assert response.usage.completion_tokens == 3 * 3


def test_sampling_fields_reach_the_engine(client):
    response = client.completions.create(
        model="smol-alias", prompt=PROMPT, max_tokens=4, temperature=0, top_p=0.9, presence_penalty=0.5,
        frequency_penalty=0.5, logit_bias={"7042": -100}, user="tester",  # 7042 is " Paris"
        extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "min_tokens": 4, "ignore_eos": True})
    assert response.model == "smol-alias"
    assert response.usage.completion_tokens == 4
    assert not response.choices[0].text.startswith(" Paris")


def test_guided_choice_constrains_output(client):
    choice = client.completions.create(model=MODEL, prompt="Is the sky blue? Answer:", max_tokens=5, temperature=0,
                                       extra_body={"guided_choice": ["yes", "no"]}).choices[0]
    assert choice.text in ("yes", "no")


def test_repeated_prompt_reports_cached_tokens(client):
    prompt = "In a quiet village at the edge of the forest there lived an old clockmaker " * 2
    client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0)
    usage = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0).usage
    assert usage.prompt_tokens_details.cached_tokens >= 16
