"""Which Jinja chat template renders a model's conversations, and how it is applied.

Resolution order (the platform contract): an explicit ``--chat-template`` (a
file, a template string, or a registered name) wins; then ``CONV_TEMPLATE``
names a registered template; then ``MODEL_ID`` is matched against the patterns
the template plugins declare; both keys are read from the environment first and
from ``ti_model_config.json`` in the model directory second; last comes the
tokenizer's own ``chat_template``.  Concrete templates and their patterns live
in plugins (``register_chat_templates``); this module only knows the protocol.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastllm import registry

KIND = "chat_templates"
CONV_TEMPLATE = "CONV_TEMPLATE"
MODEL_ID = "MODEL_ID"
TI_MODEL_CONFIG = "ti_model_config.json"
RESERVED_KWARGS = frozenset({"conversation", "chat_template", "tokenize", "tools", "add_generation_prompt"})


class TemplateFactory(Protocol):
    """What ``register_chat_templates`` maps a name to.

    Calling it returns the Jinja source; that is all a plain function offers.
    A factory may also carry these attributes, read with defaults when absent:

    - ``extra_stop_token_ids: Sequence[int]`` the template's turn-end tokens the
      model's ``eos_token_id`` may not cover;
    - ``tool_call_parser: str | None`` the tool parser its format needs;
    - ``matches_model_id(model_id: str) -> bool`` given the lower-cased
      ``MODEL_ID``, whether this template is the automatic choice;
    - ``match_order: int`` lower is tried first when several patterns match;
    - ``defers_to_tokenizer: bool`` an automatic match keeps the tokenizer's own
      template when it has one and only adds the stop ids and the tool parser.
    """

    def __call__(self) -> str: ...


@dataclass
class ResolvedTemplate:
    """The chosen template; ``source=None`` means the tokenizer's own ``chat_template``."""

    source: str | None
    name: str | None
    extra_stop_token_ids: list[int] = field(default_factory=list)
    tool_call_parser: str | None = None


def resolve_chat_template(
    tokenizer: Any,
    model_path: str,
    chat_template: str | None = None,
    environ: Mapping[str, str] = os.environ,
) -> ResolvedTemplate:
    """Pick the template for ``model_path`` following the platform's priority."""
    if chat_template:
        return _explicit(chat_template)
    for settings in (environ, _ti_model_config(model_path)):
        name = settings.get(CONV_TEMPLATE) or _match_model_id(settings.get(MODEL_ID) or "")
        if name:
            return _registered(name, tokenizer, automatic=True)
    return ResolvedTemplate(source=None, name=None)


def render_chat(
    tokenizer: Any,
    resolved: ResolvedTemplate,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    add_generation_prompt: bool = True,
) -> str:
    """The prompt text of ``messages``; ``chat_template_kwargs`` reach the template as variables."""
    template_source(tokenizer, resolved, tools)
    return tokenizer.apply_chat_template(
        list(messages),
        tools=list(tools) if tools else None,
        chat_template=resolved.source,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        **checked_kwargs(chat_template_kwargs),
    )


def template_source(tokenizer: Any, resolved: ResolvedTemplate, tools: Sequence[Mapping[str, Any]] | None) -> str:
    """The Jinja text that renders: the resolved one, else the tokenizer's (its tool-use variant with tools)."""
    if resolved.source is not None:
        return resolved.source
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "the tokenizer has no chat_template; pass --chat-template or set CONV_TEMPLATE to one of: "
            + ", ".join(registry.names(KIND))
        )
    return tokenizer.get_chat_template(None, list(tools) if tools else None)


def template_variables(tokenizer: Any, chat_template_kwargs: Mapping[str, Any] | None,
                       add_generation_prompt: bool = True) -> dict[str, Any]:
    """What a template sees besides ``messages`` and ``tools``, as ``apply_chat_template`` passes it."""
    return {**tokenizer.special_tokens_map, **checked_kwargs(chat_template_kwargs),
            "add_generation_prompt": add_generation_prompt}


def checked_kwargs(chat_template_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    extra = dict(chat_template_kwargs or {})
    if clash := RESERVED_KWARGS & extra.keys():
        raise ValueError(f"chat_template_kwargs may not set {', '.join(sorted(clash))}")
    return extra


def _explicit(value: str) -> ResolvedTemplate:
    """``--chat-template``: a file, a Jinja string, or a registered name, in that order."""
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return ResolvedTemplate(source=f.read(), name=None)
    if "{{" in value or "{%" in value:
        return ResolvedTemplate(source=value, name=None)
    if value in registry.names(KIND):
        return _registered(value, tokenizer=None, automatic=False)
    raise ValueError(
        f"--chat-template {value!r} is not a file, a Jinja template or a registered name; "
        f"registered chat templates: {', '.join(registry.names(KIND)) or '(none)'}"
    )


def _registered(name: str, tokenizer: Any, automatic: bool) -> ResolvedTemplate:
    """The registered template ``name``; an unknown name raises UnknownPluginError (a ValueError)."""
    factory = registry.get(KIND, name)
    keep_own = automatic and getattr(factory, "defers_to_tokenizer", False)
    own = keep_own and getattr(tokenizer, "chat_template", None)
    return ResolvedTemplate(
        source=None if own else factory(),
        name=name,
        extra_stop_token_ids=list(getattr(factory, "extra_stop_token_ids", ())),
        tool_call_parser=getattr(factory, "tool_call_parser", None),
    )


def _match_model_id(model_id: str) -> str | None:
    """The first registered template, by ``match_order``, whose pattern accepts ``model_id``."""
    if not model_id:
        return None
    candidates = sorted(
        (getattr(entry.factory, "match_order", 0), name)
        for name, entry in registry.entries(KIND).items()
        if callable(getattr(entry.factory, "matches_model_id", None))
    )
    for _, name in candidates:
        if registry.get(KIND, name).matches_model_id(model_id.lower()):
            return name
    return None


def _ti_model_config(model_path: str) -> dict[str, str]:
    """``CONV_TEMPLATE`` and ``MODEL_ID`` from the model directory's platform file, keys in any case."""
    path = os.path.join(model_path, TI_MODEL_CONFIG)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except ValueError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from err
    if not isinstance(config, dict):
        raise ValueError(f"{path} must hold a JSON object")
    upper = {str(key).upper(): value for key, value in config.items()}
    return {key: str(upper[key]) for key in (CONV_TEMPLATE, MODEL_ID) if upper.get(key)}
