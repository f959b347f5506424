"""Structured outputs (JSON schema, JSON object, regex, Lark/EBNF, choice) for fastllm through llguidance."""
