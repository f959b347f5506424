"""The extension points of fastllm: one hook per registry kind.

A plugin is a module of ``@hookimpl`` functions named after these specs, exposed
through the setuptools entry-point group ``fastllm``.  Every hook returns a
mapping ``name -> factory``; the registry of that kind merges the mappings and
remembers which distribution supplied each name.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable, Optional

import pluggy

hookspec = pluggy.HookspecMarker("fastllm")
hookimpl = pluggy.HookimplMarker("fastllm")

Factories = dict[str, Callable[..., Any]]


@hookspec
def register_models() -> Factories:
    """Model classes keyed by HF architecture name (``LlamaForCausalLM``).

    A class is built as ``cls(hf_config)`` (the checkpoint's transformers config) under the
    engine's default dtype and device, and must follow ``fastllm.models.interface.CausalLM``.
    Check it with ``fastllm.testing.models.assert_greedy_matches_hf``.
    """


@hookspec
def register_load_formats() -> Factories:
    """Weight loaders keyed by format (``safetensors``, ``gguf``, ``dummy``).

    Each follows ``fastllm.model_loader.interface.ModelLoader``.
    """


@hookspec
def register_attention_backends() -> Factories:
    """Paged-attention implementations keyed by name (``torch``, ``triton``).

    A factory is called as ``cls(platform)`` and follows ``fastllm.attention.interface.AttentionBackend``.
    """


@hookspec
def register_platforms() -> Factories:
    """Hardware platforms keyed by name (``cpu``, ``cuda``).

    Each follows ``fastllm.platforms.interface.Platform``.
    """


@hookspec
def register_quantizers() -> Factories:
    """Weight quantization methods keyed by the ``quantization=`` name (aliases share a class).

    Each factory is built as ``cls(checkpoint_config)`` and follows
    ``fastllm.quantization.interface.Quantizer`` (check an online method with
    ``fastllm.testing.quantizers.assert_quantized_linear_close``); a checkpoint whose config.json declares
    ``quantization_config.quant_method`` is loaded by the quantizer registered under that name.
    """


@hookspec
def register_lm_head_quantizers() -> Factories:
    """What ``quantize_lm_head=True`` runs, keyed by name; one plugin registers it. Each factory
    is called as ``factory(model)`` after the body is quantized and gives ``model.lm_head`` (a
    ``ParallelLMHead``) its ``quantized`` module, dropping the float weight unless it is tied.
    """


@hookspec
def register_reasoning_parsers() -> Factories:
    """Parsers that split chain-of-thought from the answer, keyed by ``reasoning_parser=`` name.

    A factory is called as ``cls(tokenizer, enable_thinking=...)`` and returns a
    ``fastllm.chat.ReasoningParser``; check it with
    ``fastllm.testing.parsers.assert_streaming_matches_extract``.
    """


@hookspec
def register_tool_parsers() -> Factories:
    """Parsers that extract tool calls from generated text, keyed by ``tool_call_parser=`` name.

    A factory is called as ``cls(tokenizer)`` and returns a ``fastllm.chat.ToolParser``; check it
    with ``fastllm.testing.parsers.assert_streaming_matches_extract``.
    """


@hookspec
def register_speculative_decoders() -> Factories:
    """Draft-token proposers keyed by ``speculative_config["method"]``.

    A factory is called as ``cls(speculative_config, engine_config)`` and follows
    ``fastllm.spec_decode.interface.SpeculativeDecoder``.
    """


@hookspec
def register_structured_output_backends() -> Factories:
    """Grammar backends (JSON schema, regex, EBNF, choice), keyed by ``structured_output_backend=``.

    A factory is called as ``cls(tokenizer, vocab_size)`` and follows
    ``fastllm.structured_output.interface.StructuredOutputBackend``.
    """


@hookspec
def register_chat_templates() -> Factories:
    """Chat templates keyed by name (``chat_template=``), each a
    ``fastllm.chat.template.TemplateFactory``: calling it returns the Jinja source, and its
    attributes (extra stop ids, tool parser, model-id rule) are the template's serving defaults."""


@hookspec
def register_multimodal_processors() -> Factories:
    """Image/video input processing keyed by HF architecture name (as ``register_models``).

    A factory is called as ``cls(hf_config, tokenizer, model_path)`` and follows
    ``fastllm.multimodal.interface.MultimodalProcessor``; the model class of the same
    architecture takes its items through ``encode_multimodal`` and ``forward(..., multimodal=)``.
    """


@hookspec
def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Add a plugin's own flags to every subcommand that builds an engine (``serve``,
    ``generate``, ``chat``, ``bench``), so the core's CLI names no plugin."""


@hookspec
def engine_args_to_config(args: argparse.Namespace) -> Optional[dict[str, Any]]:
    """``EngineConfig`` fields from the plugin's flags (or its documented environment variables),
    or None; a field the user set through a core flag wins."""


@hookspec
def register_adapter_managers() -> Factories:
    """Per-request adapter servers keyed by kind (``lora``, for ``enable_lora=True``).

    A class is built as ``cls(model, engine_config)`` after the weights are loaded (and
    quantized); it may wrap the model's linear layers, and follows
    ``fastllm.adapters.AdapterManager``.
    """


@hookspec
def register_cli_commands() -> Factories:
    """``fastllm`` subcommands a plugin adds, keyed by name; each factory is a
    ``register(subparsers)`` like the built-in command modules'."""
