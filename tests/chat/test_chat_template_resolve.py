"""The platform's template resolution order, and render_chat's contract."""

from __future__ import annotations

import json

import pytest

from fastllm import registry
from fastllm.chat import ResolvedTemplate, render_chat, resolve_chat_template

OWN = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
HELLO = [{"role": "user", "content": "Hello"}]


def packaged(name: str) -> str:
    return registry.get("chat_templates", name)()


# (MODEL_ID, template, extra stop ids, tool parser) per row of the platform table; None: no match.
MODEL_IDS = [
    ("tencent/Tencent-Hunyuan-Large", "hunyuan", [127960, 127967], None),
    ("Tencent/shennong-chat-13b", "shennong_chat", [], None),
    ("sn-finance-7b", "shennong_chat", [], None),
    ("meta-llama/Llama-3.2-11B-Vision-Instruct", "llama-3.2-vision", [], "llama3_json"),
    ("meta-llama/Llama-3.2-3B-Instruct", "llama-3.2", [], "llama3_json"),
    ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1", [], "llama3_json"),
    ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5", [], "hermes"),
    ("baichuan-inc/Baichuan2-13B-Chat", "baichuan2-chat", [], None),
    ("meta-llama/Llama-2-7b-chat-hf", "llama-2", [], None),
    ("meta-llama/Meta-Llama-3-8B-Instruct", "llama-3", [128001, 128009], None),
    ("Qwen/Qwen-7B-Chat", "qwen", [151643, 151644, 151645], None),
    ("Qwen/Qwen2-VL-7B-Instruct", None, [], None),
    ("meta-llama/Llama-3.2-1B", None, [], None),
    ("Qwen/Qwen3-8B", None, [], None),
    ("model", None, [], None),
]


@pytest.mark.parametrize("model_id, name, stop_ids, parser", MODEL_IDS)
def test_model_id_follows_the_platform_table(monkeypatch, make_tokenizer, model_id, name, stop_ids, parser):
    monkeypatch.setenv("MODEL_ID", model_id)
    resolved = resolve_chat_template(make_tokenizer(), "/nonexistent")
    assert (resolved.name, resolved.extra_stop_token_ids, resolved.tool_call_parser) == (name, stop_ids, parser)
    assert resolved.source == (packaged(name) if name else None)


def test_conv_template_beats_model_id(monkeypatch, make_tokenizer):
    monkeypatch.setenv("MODEL_ID", "Qwen/Qwen-7B-Chat")
    monkeypatch.setenv("CONV_TEMPLATE", "llama-3")
    resolved = resolve_chat_template(make_tokenizer(), "/nonexistent")
    assert resolved == ResolvedTemplate(packaged("llama-3"), "llama-3", [128001, 128009])


def test_explicit_file_beats_the_environment(monkeypatch, make_tokenizer, tmp_path):
    monkeypatch.setenv("CONV_TEMPLATE", "llama-3")
    path = tmp_path / "mine.jinja"
    path.write_text(OWN)
    assert resolve_chat_template(make_tokenizer(), str(tmp_path), str(path)) == ResolvedTemplate(OWN, None)


def test_explicit_template_string_and_registered_name(make_tokenizer):
    assert resolve_chat_template(make_tokenizer(), "/m", OWN).source == OWN
    assert resolve_chat_template(make_tokenizer(), "/m", "qwen3").source == packaged("qwen3")


def test_explicit_value_that_is_nothing_lists_the_registered_names(make_tokenizer):
    with pytest.raises(ValueError, match="llama-3.1") as error:
        resolve_chat_template(make_tokenizer(), "/m", "examples/missing.jinja")
    assert "not a file" in str(error.value)


def test_unknown_conv_template_lists_the_registered_names(make_tokenizer):
    with pytest.raises(ValueError, match="qwen2.5") as error:
        resolve_chat_template(make_tokenizer(), "/m", environ={"CONV_TEMPLATE": "vicuna"})
    assert "'vicuna'" in str(error.value)


def test_ti_model_config_is_read_after_the_environment(make_tokenizer, tmp_path):
    (tmp_path / "ti_model_config.json").write_text(json.dumps({"model_id": "Meta-Llama-3-8B-Instruct"}))
    assert resolve_chat_template(make_tokenizer(), str(tmp_path), environ={}).name == "llama-3"
    from_env = resolve_chat_template(make_tokenizer(), str(tmp_path), environ={"MODEL_ID": "Qwen-7B-Chat"})
    assert from_env.name == "qwen"
    (tmp_path / "ti_model_config.json").write_text(json.dumps({"CONV_TEMPLATE": "generate"}))
    assert resolve_chat_template(make_tokenizer(), str(tmp_path), environ={}).name == "generate"


def test_broken_ti_model_config_is_a_clear_error(make_tokenizer, tmp_path):
    (tmp_path / "ti_model_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="ti_model_config.json"):
        resolve_chat_template(make_tokenizer(), str(tmp_path), environ={})


def test_without_settings_the_tokenizer_template_is_used(make_tokenizer):
    tokenizer = make_tokenizer(chat_template=OWN)
    resolved = resolve_chat_template(tokenizer, "/m", environ={})
    assert resolved == ResolvedTemplate(None, None)
    assert render_chat(tokenizer, resolved, HELLO) == "[user]Hello"


def test_qwen25_keeps_the_model_template_and_adds_the_tool_parser(make_tokenizer):
    environ = {"MODEL_ID": "Qwen/Qwen2.5-7B-Instruct"}
    own = resolve_chat_template(make_tokenizer(chat_template=OWN), "/m", environ=environ)
    assert (own.source, own.name, own.tool_call_parser) == (None, "qwen2.5", "hermes")
    assert resolve_chat_template(make_tokenizer(), "/m", environ=environ).source == packaged("qwen2.5")


def test_render_chat_passes_template_kwargs(make_tokenizer):
    resolved = resolve_chat_template(make_tokenizer(), "/m", "qwen3")
    prompt = render_chat(make_tokenizer(), resolved, HELLO, chat_template_kwargs={"enable_thinking": False})
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert render_chat(make_tokenizer(), resolved, HELLO, add_generation_prompt=False).endswith("<|im_end|>\n")


def test_render_chat_rejects_kwargs_that_would_change_the_call(make_tokenizer):
    resolved = ResolvedTemplate(OWN, None)
    with pytest.raises(ValueError, match="tokenize"):
        render_chat(make_tokenizer(), resolved, HELLO, chat_template_kwargs={"tokenize": True})


def test_render_chat_without_any_template_says_what_to_set(make_tokenizer):
    with pytest.raises(ValueError, match="CONV_TEMPLATE"):
        render_chat(make_tokenizer(), ResolvedTemplate(None, None), HELLO)
