"""Qwen2 / Qwen2.5: Llama with biases on the query, key and value projections."""

from fastllm.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM


class Qwen2Attention(LlamaAttention):
    qkv_bias = True


class Qwen2DecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen2Attention


class Qwen2ForCausalLM(LlamaForCausalLM):
    layer_cls = Qwen2DecoderLayer
