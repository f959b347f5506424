"""Structured outputs (JSON schema, JSON object, regex, EBNF, choice) for fastllm through xgrammar."""
