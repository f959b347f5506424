"""Every packaged template renders; the main families give exactly their models' prompts."""

from __future__ import annotations

import pytest

from fastllm import registry
from fastllm.chat import ResolvedTemplate, render_chat

CONVERSATION = [
    {"role": "system", "content": "You are a bot."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "What is 2+2?"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
TOOL_TURN = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
]
TOOL_TEMPLATES = {"llama-3.1", "llama-3.2", "llama-3.2-vision", "qwen2.5", "qwen3"}


def render(tokenizer, name: str, messages, **kwargs) -> str:
    resolved = ResolvedTemplate(registry.get("chat_templates", name)(), name)
    return render_chat(tokenizer, resolved, messages, **kwargs)


@pytest.mark.parametrize("name", registry.names("chat_templates"))
def test_every_template_renders_every_message(make_tokenizer, name):
    prompt = render(make_tokenizer(), name, CONVERSATION)
    for message in CONVERSATION:
        assert message["content"] in prompt


@pytest.mark.parametrize("name", sorted(TOOL_TEMPLATES))
def test_tool_templates_render_tools_calls_and_results(make_tokenizer, name):
    prompt = render(make_tokenizer(), name, CONVERSATION[:1] + TOOL_TURN, tools=TOOLS)
    assert '"get_weather"' in prompt and '"Current weather"' in prompt
    assert '{"city": "Paris"}' in prompt and "sunny" in prompt


def test_chatml_qwen(make_tokenizer):
    assert render(make_tokenizer(), "qwen", CONVERSATION) == (
        "<|im_start|>system\nYou are a bot.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert render(make_tokenizer(), "qwen", CONVERSATION[1:2]) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_qwen25_with_tools(make_tokenizer):
    assert render(make_tokenizer(), "qwen2.5", TOOL_TURN, tools=TOOLS) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n"
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name": "get_weather", "description": "Current weather", '
        '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}\n'
        "</tools>\n\nFor each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_llama3(make_tokenizer):
    assert render(make_tokenizer("<|begin_of_text|>", "<|end_of_text|>"), "llama-3", CONVERSATION) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a bot.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_llama31_puts_tools_in_the_first_user_message(make_tokenizer):
    prompt = render(
        make_tokenizer("<|begin_of_text|>"), "llama-3.1", TOOL_TURN, tools=TOOLS,
        chat_template_kwargs={"date_string": "01 Jan 2025"},
    )
    assert prompt.startswith(
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 01 Jan 2025\n\n<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON "
        "for a function call with its proper arguments that best answers the given prompt.\n\n"
    )
    assert prompt.endswith(
        '}\n\nWeather in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n'
        '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>'
        "<|start_header_id|>ipython<|end_header_id|>\n\nsunny<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


@pytest.mark.parametrize("thinking, cue", [(False, "<think>\n\n</think>\n\n"), (True, "")])
def test_qwen3_enable_thinking(make_tokenizer, thinking, cue):
    thought = {"role": "assistant", "content": "<think>\nGreet back.\n</think>\n\nHello!"}
    history = [*CONVERSATION[:2], thought, *CONVERSATION[3:]]
    prompt = render(make_tokenizer(), "qwen3", history, chat_template_kwargs={"enable_thinking": thinking})
    assert prompt == (
        "<|im_start|>system\nYou are a bot.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n" + cue
    )


def test_qwen3_keeps_the_thought_of_a_tool_chain_in_progress(make_tokenizer):
    chain = [
        TOOL_TURN[0],
        {**TOOL_TURN[1], "reasoning_content": "Need the weather."},
        TOOL_TURN[2],
    ]
    assert render(make_tokenizer(), "qwen3", chain, add_generation_prompt=False) == (
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nNeed the weather.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
    )


def test_other_families(make_tokenizer):
    tokenizer = make_tokenizer("<s>", "</s>")
    assert render(tokenizer, "llama-2", CONVERSATION) == (
        "<s>[INST] <<SYS>>\nYou are a bot.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] What is 2+2? [/INST]"
    )
    assert render(tokenizer, "baichuan2-chat", CONVERSATION) == (
        "You are a bot.<reserved_106>Hi<reserved_107>Hello!<reserved_106>What is 2+2?<reserved_107>"
    )
    assert render(tokenizer, "hunyuan", CONVERSATION) == (
        "<|startoftext|>You are a bot.<|extra_4|>Hi<|extra_0|>Hello!<|eos|><|startoftext|>What is 2+2?<|extra_0|>"
    )
    assert render(tokenizer, "generate", CONVERSATION[1:2]) == "Hi"
    assert render(tokenizer, "ernie-4.5", CONVERSATION, chat_template_kwargs={"enable_thinking": False}) == (
        "<|begin_of_sentence|>You are a bot.\nUser: Hi\nAssistant: Hello!<|end_of_sentence|>"
        "User: What is 2+2?\nAssistant: <think>\n\n</think>\n\n"
    )


def test_llama32_vision_images(make_tokenizer):
    image = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}]
    assert render(make_tokenizer("<|begin_of_text|>"), "llama-3.2-vision", image) == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n<|image|>What is this?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
