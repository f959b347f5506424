"""Registries: built-ins come through entry points; unknown names list what exists."""

from __future__ import annotations

import pytest

from fastllm import registry
from fastllm.registry.registry import Entry, UnknownPluginError


def test_builtins_are_registered_through_entry_points():
    for kind, name in [("models", "LlamaForCausalLM"), ("models", "Qwen2ForCausalLM"),
                       ("models", "Qwen3ForCausalLM"), ("load_formats", "gguf"), ("load_formats", "dummy"),
                       ("load_formats", "safetensors"), ("attention_backends", "torch"), ("platforms", "cpu")]:
        entry = registry.entries(kind)[name]
        assert entry.distribution.startswith("fastllm ")
        assert registry.get(kind, name) is entry.factory


def test_unknown_name_lists_registered_names():
    with pytest.raises(UnknownPluginError) as info:
        registry.get("load_formats", "pickle")
    message = str(info.value)
    assert "'pickle'" in message and "gguf" in message and "safetensors" in message


def test_unknown_kind_is_an_error():
    with pytest.raises(ValueError, match="kinds are"):
        registry.entries("widgets")


def test_cli_lists_every_kind(capsys):
    from fastllm.entrypoints.cli.main import main

    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    for kind in registry.KINDS:
        assert f"{kind}:" in out
    assert "LlamaForCausalLM" in out


def test_error_message_formats_entries():
    err = UnknownPluginError("quantizers", "q9", {"fp8": Entry("fp8", object, "fastllm-plugin-quant 0.1.0")})
    assert "fp8" in str(err) and "fastllm-plugin-quant" in str(err)


def test_only_picks_the_one_plugin_of_a_kind(monkeypatch):
    """A feature that names no plugin (``enable_lora``, ``quantize_lm_head``) takes the one
    registered; aliases of one factory count once; none or several fail with the list."""
    def head(model):
        return None

    def other(model):
        return None

    found = {"int8": Entry("int8", head, "a 1"), "alias": Entry("alias", head, "a 1")}
    monkeypatch.setattr("fastllm.registry.registry.entries", lambda kind: found)
    assert registry.only("lm_head_quantizers", "quantize_lm_head").factory is head
    found["other"] = Entry("other", other, "b 2")
    with pytest.raises(ValueError, match="several plugins register one") as info:
        registry.only("lm_head_quantizers", "quantize_lm_head")
    assert "quantize_lm_head" in str(info.value) and "other" in str(info.value) and "b 2" in str(info.value)
    found.clear()
    with pytest.raises(ValueError, match=r"no plugin registers one:\n  \(none\)"):
        registry.only("adapter_managers", "enable_lora")


def test_lm_head_quantizer_and_adapter_manager_come_from_plugins():
    assert registry.only("lm_head_quantizers", "quantize_lm_head").distribution.startswith("fastllm-plugin-quant")
    assert registry.only("adapter_managers", "enable_lora").distribution.startswith("fastllm-plugin-lora")
