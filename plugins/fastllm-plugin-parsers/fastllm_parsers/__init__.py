"""Reasoning and tool-call parsers for fastllm, registered through the ``fastllm`` entry points."""
