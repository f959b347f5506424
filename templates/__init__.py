"""fastllm's packaged chat templates: ``.jinja`` files plus the platform's matching table."""
