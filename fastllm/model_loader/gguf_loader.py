"""Single-file GGUF checkpoints (llama.cpp): dequantized with the ``gguf`` package.

Config and tokenizer come from the file's metadata through transformers' GGUF
support; tensors are renamed to HF names and llama.cpp's Q/K row permutation is undone.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from typing import Any, Iterator, Optional

import gguf
import numpy as np
import torch
import torch.nn as nn
from transformers import AutoConfig, AutoTokenizer

# llama.cpp tensor name -> HF name; {n} is the layer index
_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{n}.attn_q.{p}": "model.layers.{n}.self_attn.q_proj.{p}",
    "blk.{n}.attn_k.{p}": "model.layers.{n}.self_attn.k_proj.{p}",
    "blk.{n}.attn_v.{p}": "model.layers.{n}.self_attn.v_proj.{p}",
    "blk.{n}.attn_output.{p}": "model.layers.{n}.self_attn.o_proj.{p}",
    "blk.{n}.attn_q_norm.weight": "model.layers.{n}.self_attn.q_norm.weight",
    "blk.{n}.attn_k_norm.weight": "model.layers.{n}.self_attn.k_norm.weight",
    "blk.{n}.ffn_gate.{p}": "model.layers.{n}.mlp.gate_proj.{p}",
    "blk.{n}.ffn_up.{p}": "model.layers.{n}.mlp.up_proj.{p}",
    "blk.{n}.ffn_down.{p}": "model.layers.{n}.mlp.down_proj.{p}",
    "blk.{n}.attn_norm.weight": "model.layers.{n}.input_layernorm.weight",
    "blk.{n}.ffn_norm.weight": "model.layers.{n}.post_attention_layernorm.weight",
}
_PATTERNS = [
    (re.compile("^" + re.escape(src).replace(r"\{n\}", r"(?P<n>\d+)").replace(r"\{p\}", r"(?P<p>weight|bias)") + "$"), dst)
    for src, dst in _NAMES.items()
]
SUPPORTED_TYPES = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q8_K"}


def hf_name(gguf_name: str) -> str:
    for pattern, dst in _PATTERNS:
        match = pattern.match(gguf_name)
        if match:
            return dst.format(**match.groupdict())
    raise KeyError(f"GGUF tensor {gguf_name!r} has no known HF name")


def unpermute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's interleaving of each head's rotary halves (q and k of Llama)."""
    rows = weight.shape[0]
    return (weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


@functools.lru_cache(maxsize=2)
def open_reader(path: str) -> gguf.GGUFReader:
    """Parsing a GGUF header takes seconds in Python: do it once per file."""
    return gguf.GGUFReader(path)


def read_tensors(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of the file, HF-named, dequantized to float32 in HF orientation."""
    reader = open_reader(path)
    arch = reader.fields["general.architecture"].contents()
    heads = reader.fields[f"{arch}.attention.head_count"].contents()
    kv_heads = reader.fields.get(f"{arch}.attention.head_count_kv")
    kv_heads = kv_heads.contents() if kv_heads is not None else heads
    for tensor in reader.tensors:
        qtype = tensor.tensor_type.name
        if qtype not in SUPPORTED_TYPES:
            raise ValueError(f"GGUF tensor {tensor.name} has unsupported type {qtype}")
        shape = tuple(int(d) for d in reversed(tensor.shape))
        array = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape).astype(np.float32)
        name = hf_name(tensor.name)
        if arch == "llama" and name.endswith("q_proj.weight"):
            array = unpermute(array, heads)
        elif arch == "llama" and name.endswith("k_proj.weight"):
            array = unpermute(array, kv_heads)
        yield name, torch.from_numpy(np.ascontiguousarray(array))


_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def config_from_metadata(reader: gguf.GGUFReader) -> Any:
    """The HF config of a GGUF file, read from its metadata alone (no tensor is touched)."""
    fields = reader.fields

    def get(key: str, default: Any = None) -> Any:
        field = fields.get(key)
        return field.contents() if field is not None else default

    arch = get("general.architecture")
    if arch not in _ARCHITECTURES:
        raise ValueError(f"GGUF architecture {arch!r} is not supported ({', '.join(_ARCHITECTURES)})")
    heads = get(f"{arch}.attention.head_count")
    tensor_names = {t.name for t in reader.tensors}
    values = dict(
        architectures=[_ARCHITECTURES[arch]],
        vocab_size=get(f"{arch}.vocab_size") or len(fields["tokenizer.ggml.tokens"].data),
        hidden_size=get(f"{arch}.embedding_length"),
        intermediate_size=get(f"{arch}.feed_forward_length"),
        num_hidden_layers=get(f"{arch}.block_count"),
        num_attention_heads=heads,
        num_key_value_heads=get(f"{arch}.attention.head_count_kv", heads),
        rms_norm_eps=get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6),
        rope_theta=get(f"{arch}.rope.freq_base", 10000.0),
        max_position_embeddings=get(f"{arch}.context_length", 2048),
        tie_word_embeddings="output.weight" not in tensor_names,
        attention_bias=False,
        bos_token_id=get("tokenizer.ggml.bos_token_id"),
        eos_token_id=get("tokenizer.ggml.eos_token_id"),
    )
    head_dim = get(f"{arch}.attention.key_length")
    if head_dim:
        values["head_dim"] = head_dim
    return AutoConfig.for_model(arch, **values)


def tokenizer_cache_dir(model: str) -> str:
    """Where the tokenizer converted from a GGUF file is kept: converting it re-parses the whole
    file in Python (tens of seconds for SmolLM2 on a small CPU), loading the saved copy takes
    well under one. Keyed by the file's path, size and modification time."""
    stat = os.stat(model)
    key = hashlib.sha256(f"{os.path.abspath(model)}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    root = os.environ.get("FASTLLM_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "fastllm")
    return os.path.join(root, "gguf-tokenizers", key)


class GGUFLoader:
    @staticmethod
    def _split(model: str) -> tuple[str, str]:
        return os.path.dirname(os.path.abspath(model)), os.path.basename(model)

    def load_config(self, model: str) -> Any:
        return config_from_metadata(open_reader(model))

    def load_tokenizer(self, model: str, tokenizer: Optional[str]) -> Any:
        if tokenizer:
            return AutoTokenizer.from_pretrained(tokenizer)
        cached = tokenizer_cache_dir(model)
        if os.path.isfile(os.path.join(cached, "tokenizer_config.json")):
            return AutoTokenizer.from_pretrained(cached)
        folder, name = self._split(model)
        converted = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        try:
            converted.save_pretrained(cached)
        except OSError:  # a read-only home: convert again next time
            pass
        return converted

    def load_weights(self, model: str, module: nn.Module) -> None:
        module.load_weights(read_tensors(model))
