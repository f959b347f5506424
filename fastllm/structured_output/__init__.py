"""The typed contract between the engine and structured-output (guided decoding) plugins."""

from fastllm.structured_output.interface import CompiledGrammar, GrammarMatcher, StructuredOutputBackend

__all__ = ["CompiledGrammar", "GrammarMatcher", "StructuredOutputBackend"]
