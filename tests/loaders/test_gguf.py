"""GGUF reading: every supported quant type dequantizes to the written values, names map to HF,
and llama.cpp's Q/K permutation is undone."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from fastllm.model_loader.gguf_loader import GGUFLoader, read_tensors, unpermute

HEADS, KV_HEADS, HIDDEN, FFN, LAYERS, VOCAB = 4, 2, 64, 128, 1, 96
TOLERANCE = {"F32": 0, "F16": 1e-3, "BF16": 1e-2, "Q8_0": 1e-2, "Q4_0": 0.15, "Q4_1": 0.1}


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """What llama.cpp's converter does to q/k rows (convert_hf_to_gguf.py's permute)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_unpermute_inverts_llama_cpp_permute():
    w = np.random.default_rng(0).standard_normal((HEADS * 16, 8)).astype(np.float32)
    np.testing.assert_array_equal(unpermute(llama_cpp_permute(w, HEADS), HEADS), w)


def _write(path, qtype_name: str, rng) -> dict[str, np.ndarray]:
    qtype = gguf.GGMLQuantizationType[qtype_name]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(LAYERS)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_context_length(256)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(VOCAB)
    shapes = {
        "token_embd.weight": (VOCAB, HIDDEN), "output.weight": (VOCAB, HIDDEN), "output_norm.weight": (HIDDEN,),
        "blk.0.attn_q.weight": (HIDDEN, HIDDEN), "blk.0.attn_k.weight": (KV_HEADS * 16, HIDDEN),
        "blk.0.attn_v.weight": (KV_HEADS * 16, HIDDEN), "blk.0.attn_output.weight": (HIDDEN, HIDDEN),
        "blk.0.ffn_gate.weight": (FFN, HIDDEN), "blk.0.ffn_up.weight": (FFN, HIDDEN),
        "blk.0.ffn_down.weight": (HIDDEN, FFN), "blk.0.attn_norm.weight": (HIDDEN,),
        "blk.0.ffn_norm.weight": (HIDDEN,),
    }
    originals = {}
    for name, shape in shapes.items():
        w = rng.standard_normal(shape).astype(np.float32)
        originals[name] = w
        stored = w
        if name == "blk.0.attn_q.weight":
            stored = llama_cpp_permute(w, HEADS)
        elif name == "blk.0.attn_k.weight":
            stored = llama_cpp_permute(w, KV_HEADS)
        if len(shape) == 1 or qtype_name == "F32":
            writer.add_tensor(name, stored)
        elif qtype_name == "F16":
            writer.add_tensor(name, stored.astype(np.float16))
        else:
            data = gguf.quants.quantize(stored, qtype)
            writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return originals


@pytest.mark.parametrize("qtype", list(TOLERANCE))
def test_dequantized_tensors_match_written(tmp_path, qtype):
    path = tmp_path / f"tiny-{qtype}.gguf"
    originals = _write(path, qtype, np.random.default_rng(1))
    tensors = dict(read_tensors(str(path)))
    expected_names = {
        "token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight",
        "blk.0.attn_q.weight": "model.layers.0.self_attn.q_proj.weight",
        "blk.0.attn_k.weight": "model.layers.0.self_attn.k_proj.weight",
        "blk.0.ffn_down.weight": "model.layers.0.mlp.down_proj.weight",
        "blk.0.attn_norm.weight": "model.layers.0.input_layernorm.weight",
    }
    for gguf_name, hf_name in expected_names.items():
        ref = torch.from_numpy(originals[gguf_name])
        got = tensors[hf_name]
        assert got.shape == ref.shape
        rel = ((got - ref).norm() / ref.norm()).item()
        assert rel <= TOLERANCE[qtype] + 1e-7, f"{qtype} {hf_name}: relative error {rel}"
    config = GGUFLoader().load_config(str(path))
    assert (config.num_attention_heads, config.num_key_value_heads, config.hidden_size) == (HEADS, KV_HEADS, HIDDEN)
    assert config.architectures == ["LlamaForCausalLM"] and not config.tie_word_embeddings


def test_cached_tokenizer_matches_the_converted_one(smollm2_path, tmp_path, monkeypatch):
    """The first load converts the GGUF's tokenizer and saves it; the second reads the saved copy."""
    monkeypatch.setenv("FASTLLM_CACHE_DIR", str(tmp_path))
    converted = GGUFLoader().load_tokenizer(smollm2_path, None)
    cached = GGUFLoader().load_tokenizer(smollm2_path, None)
    assert list((tmp_path / "gguf-tokenizers").iterdir())
    texts = ["Hello world!  The café costs $3.50\n\n\tdef f(x): return x**2", "<|im_start|>user\nhi<|im_end|>",
             "日本語のテキスト 🙂"]
    for text in texts:
        ids = converted.encode(text)
        assert cached.encode(text) == ids
        assert cached.decode(ids) == converted.decode(ids)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three colours."}]
    render = dict(tokenize=False, add_generation_prompt=True)
    assert cached.apply_chat_template(messages, **render) == converted.apply_chat_template(messages, **render)
    assert (cached.eos_token_id, cached.bos_token_id, len(cached), cached.all_special_ids) == \
        (converted.eos_token_id, converted.bos_token_id, len(converted), converted.all_special_ids)


def test_dummy_model_served_with_a_gguf_tokenizer(tiny_llama_dir, smollm2_path):
    """``tokenizer=<file>.gguf`` plus a vocabulary override: random weights that speak in SmolLM2's tokens."""
    from fastllm import LLM, SamplingParams

    llm = LLM(tiny_llama_dir, load_format="dummy", tokenizer=smollm2_path, hf_overrides={"vocab_size": 49152},
              max_model_len=256, num_gpu_blocks_override=8)
    out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=8, temperature=0.0),
                       use_tqdm=False)[0]
    assert llm.engine.hf_config.vocab_size == 49152
    assert out.prompt_token_ids == llm.engine.tokenizer.encode("The capital of France is")
    assert out.outputs.text == llm.engine.tokenizer.decode(out.outputs.token_ids)
    assert len(out.outputs.token_ids) == 8 and out.outputs.text
