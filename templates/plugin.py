"""Registers the packaged chat templates with fastllm.

The table is the platform's automatic matching contract, tried top to bottom:
template name (``CONV_TEMPLATE``), ``MODEL_ID`` substrings (case-insensitive),
the tool parser switched on, and stop token ids beyond the model's eos.
``ernie-4.5`` and ``qwen3`` are not in the platform table and are chosen by
name only.  Shennong's prompt format is not published; it is served with the
Hunyuan layout it descends from, without Hunyuan-Large's extra stop ids.
"""

from __future__ import annotations

from dataclasses import replace

import pluggy

from fastllm_templates.spec import ChatTemplate, ModelIdRule

hookimpl = pluggy.HookimplMarker("fastllm")

CHAT = ("instruct", "chat")

TABLE: dict[str, ChatTemplate] = {
    "generate": ChatTemplate("generate.jinja"),
    "hunyuan": ChatTemplate(
        "hunyuan.jinja", extra_stop_token_ids=(127960, 127967), rule=ModelIdRule(all_of=("hunyuan-large",))
    ),
    "shennong_chat": ChatTemplate("hunyuan.jinja", rule=ModelIdRule(any_of=("shennong", "sn-"))),
    "llama-3.2-vision": ChatTemplate(
        "llama3.2_vision.jinja", tool_call_parser="llama3_json",
        rule=ModelIdRule(all_of=("llama-3.2", "vision"), any_of=CHAT),
    ),
    "llama-3.2": ChatTemplate(
        "llama3.2_json.jinja", tool_call_parser="llama3_json",
        rule=ModelIdRule(all_of=("llama-3.2",), none_of=("vision",), any_of=CHAT),
    ),
    "llama-3.1": ChatTemplate(
        "llama3.1_json.jinja", tool_call_parser="llama3_json", rule=ModelIdRule(all_of=("llama-3.1",), any_of=CHAT)
    ),
    "qwen2.5": ChatTemplate(
        "qwen2.5.jinja", tool_call_parser="hermes", defers_to_tokenizer=True,
        rule=ModelIdRule(all_of=("qwen2.5",), any_of=CHAT),
    ),
    "baichuan2-chat": ChatTemplate("baichuan2.jinja", rule=ModelIdRule(all_of=("baichuan2",), any_of=CHAT)),
    "llama-2": ChatTemplate("llama2.jinja", rule=ModelIdRule(all_of=("llama-2",), any_of=CHAT)),
    "llama-3": ChatTemplate(
        "llama3.jinja", extra_stop_token_ids=(128001, 128009), rule=ModelIdRule(all_of=("llama-3-",), any_of=CHAT)
    ),
    "qwen": ChatTemplate(
        "qwen.jinja", extra_stop_token_ids=(151643, 151644, 151645),
        rule=ModelIdRule(all_of=("qwen",), none_of=("vl",), any_of=CHAT),
    ),
    "ernie-4.5": ChatTemplate("ernie4.5.jinja"),
    "qwen3": ChatTemplate("qwen3.jinja", tool_call_parser="qwen3"),
}

ALIASES = {"qwen-7b-chat": "qwen"}


@hookimpl
def register_chat_templates() -> dict[str, ChatTemplate]:
    """Every template, in table order; an alias shares the template but not the model-id rule."""
    ordered = {name: replace(spec, match_order=order) for order, (name, spec) in enumerate(TABLE.items())}
    aliases = {alias: replace(ordered[target], rule=None) for alias, target in ALIASES.items()}
    return ordered | aliases
