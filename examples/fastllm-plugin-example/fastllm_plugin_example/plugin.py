"""The plugin module named by the ``fastllm`` entry point: one ``@hookimpl`` per registry."""

from fastllm.registry import hookimpl
from fastllm_plugin_example.model import SoftCapLlamaForCausalLM


@hookimpl
def register_models():
    return {"SoftCapLlamaForCausalLM": SoftCapLlamaForCausalLM}
