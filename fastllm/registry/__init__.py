"""Plugin registries: ``get(kind, name)`` returns the factory a plugin registered."""

from fastllm.registry.hookspecs import hookimpl
from fastllm.registry.registry import KINDS, Entry, UnknownPluginError, entries, get, names, only

__all__ = ["KINDS", "Entry", "UnknownPluginError", "entries", "get", "hookimpl", "names", "only"]
