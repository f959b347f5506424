"""Name -> factory registries, one per plugin kind, filled through pluggy hooks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from fastllm.registry.manager import distribution_of, plugin_manager

KINDS: tuple[str, ...] = (
    "models",
    "load_formats",
    "attention_backends",
    "platforms",
    "quantizers",
    "lm_head_quantizers",
    "reasoning_parsers",
    "tool_parsers",
    "speculative_decoders",
    "structured_output_backends",
    "chat_templates",
    "adapter_managers",
    "cli_commands",
    "multimodal_processors",
)

BUILTIN_DISTRIBUTION = "fastllm"


@dataclass(frozen=True)
class Entry:
    """One registered name: what builds it and which distribution supplied it."""

    name: str
    factory: Callable[..., Any]
    distribution: str


class UnknownPluginError(ValueError):
    """Raised at start-up for a name nobody registered; lists what is registered."""

    def __init__(self, kind: str, name: str, entries: dict[str, Entry]):
        listing = "\n".join(f"  {e.name:<28} {e.distribution}" for e in entries.values())
        super().__init__(
            f"unknown {kind[:-1].replace('_', ' ')} {name!r}; registered {kind}:\n"
            f"{listing or '  (none)'}"
        )
        self.kind, self.name = kind, name


def _is_builtin(entry: Entry) -> bool:
    return entry.distribution.split(" ")[0] == BUILTIN_DISTRIBUTION


def entries(kind: str) -> dict[str, Entry]:
    """Every registered name of ``kind``; a third-party name replaces a built-in one."""
    if kind not in KINDS:
        raise ValueError(f"unknown plugin kind {kind!r}; kinds are {', '.join(KINDS)}")
    hook = getattr(plugin_manager().hook, f"register_{kind}")
    found: dict[str, Entry] = {}
    for impl in reversed(hook.get_hookimpls()):
        distribution = distribution_of(impl.plugin)
        for name, factory in (impl.function() or {}).items():
            entry = Entry(name, factory, distribution)
            if name in found and not _is_builtin(found[name]) and _is_builtin(entry):
                continue
            found[name] = entry
    return found


def get(kind: str, name: str) -> Callable[..., Any]:
    """The factory registered as ``name`` in ``kind``, or a clear UnknownPluginError."""
    registered = entries(kind)
    if name not in registered:
        raise UnknownPluginError(kind, name, registered)
    return registered[name].factory


def only(kind: str, wanted_by: str) -> Entry:
    """The one plugin of ``kind``, for a feature that names none (``wanted_by``: the setting that
    asked); aliases of one factory count once. Fails with the list when none or several are."""
    registered = entries(kind)
    distinct = {entry.factory: entry for entry in registered.values()}
    if len(distinct) == 1:
        return next(iter(distinct.values()))
    listing = "\n".join(f"  {e.name:<28} {e.distribution}" for e in registered.values()) or "  (none)"
    problem = "no plugin registers" if not distinct else "several plugins register"
    raise ValueError(f"{wanted_by} needs one of {kind}, and {problem} one:\n{listing}")


def names(kind: str) -> list[str]:
    """The sorted names registered for ``kind``."""
    return sorted(entries(kind))
