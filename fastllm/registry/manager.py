"""The one pluggy PluginManager of the process, loaded lazily from entry points."""

from __future__ import annotations

import functools

import pluggy

from fastllm.registry import hookspecs


@functools.cache
def plugin_manager() -> pluggy.PluginManager:
    """Load every distribution's ``fastllm`` entry points once per process.

    fastllm's own built-ins are registered through the same entry points as
    third-party plugins, so nothing here knows a concrete plugin.
    """
    pm = pluggy.PluginManager("fastllm")
    pm.add_hookspecs(hookspecs)
    pm.load_setuptools_entrypoints("fastllm")
    return pm


def distribution_of(plugin: object) -> str:
    """The ``name version`` of the distribution that registered ``plugin``."""
    for registered, dist in plugin_manager().list_plugin_distinfo():
        if registered is plugin:
            return f"{dist.metadata['name']} {dist.version}"
    return "(registered at run time)"
