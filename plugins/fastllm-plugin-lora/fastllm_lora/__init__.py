"""Multi-LoRA serving for fastllm: PEFT adapters in device slots, many adapters in one batch."""
