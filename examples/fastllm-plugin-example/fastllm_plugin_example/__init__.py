"""A template for third-party fastllm plugins."""
