"""A packaged template and the platform rule that picks it from ``MODEL_ID``."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources


@dataclass(frozen=True)
class ModelIdRule:
    """Substring tests on the lower-cased ``MODEL_ID``: all of, none of, and at least one of."""

    all_of: tuple[str, ...] = ()
    none_of: tuple[str, ...] = ()
    any_of: tuple[str, ...] = ()

    def __call__(self, model_id: str) -> bool:
        return (
            all(part in model_id for part in self.all_of)
            and not any(part in model_id for part in self.none_of)
            and (not self.any_of or any(part in model_id for part in self.any_of))
        )


@dataclass(frozen=True)
class ChatTemplate:
    """One ``.jinja`` file of this package with its serving defaults.

    Follows ``fastllm.chat.template.TemplateFactory``: calling it returns the
    source; the other attributes are read by the core's resolution.
    """

    filename: str
    extra_stop_token_ids: tuple[int, ...] = ()
    tool_call_parser: str | None = None
    rule: ModelIdRule | None = None
    match_order: int = 0
    defers_to_tokenizer: bool = False

    def __call__(self) -> str:
        return resources.files(__package__).joinpath(self.filename).read_text(encoding="utf-8")

    def matches_model_id(self, model_id: str) -> bool:
        """Whether the lower-cased ``model_id`` selects this template automatically."""
        return self.rule is not None and self.rule(model_id)
