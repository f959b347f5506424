"""ERNIE-4.5's chat template and reasoning parsers end to end on the dense model:
``LLM(model, reasoning_parser=...).chat(...)`` with thinking on and off.

The checkpoint is a one-layer ERNIE-4.5 whose weights make greedy decoding a fixed chain
of successors (each token's embedding is one-hot, attention and MLP write nothing, the LM
head maps token i to its successor), so it writes a thinking model's text; its tokenizer
has ERNIE's special tokens and the packaged ERNIE template as its own chat template.
"""

from __future__ import annotations

import pytest
import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

from fastllm import LLM, SamplingParams
from fastllm.registry import registry
from tests.conftest import hf_greedy

SPECIAL = ["<|begin_of_sentence|>", "<|end_of_sentence|>"]
WORDS = ["<think>", "</think>", "<response>", "</response>", "Because", "Paris"]
NEWLINE = "Ċ"  # the byte-level token of "\n", last in a prompt whose thought the template closed
# token -> the token greedy decoding writes after it
CHAINS = {
    "ernie-x1": {"<think>": "Because", "Because": "</think>", "</think>": "<response>", NEWLINE: "<response>",
                 "<response>": "Paris", "Paris": "</response>", "</response>": "<|end_of_sentence|>"},
    "ernie-45-vl": {"<think>": "Because", "Because": "</think>", "</think>": "Paris", NEWLINE: "Paris",
                    "Paris": "<|end_of_sentence|>"},
}


def _tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE without merges (any text round-trips) plus ERNIE's tokens."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True) for t in SPECIAL])
    backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in WORDS])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=SPECIAL[0], eos_token=SPECIAL[1],
                                   chat_template=registry.get("chat_templates", "ernie-4.5")())


def _save_chain_model(folder, tokenizer, chain: dict[str, str]) -> torch.nn.Module:
    vocab = len(tokenizer)
    config = AutoConfig.for_model(
        "ernie4_5", vocab_size=vocab, hidden_size=vocab, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
        tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not name.endswith("norm.weight"):
                param.zero_()
        model.model.embed_tokens.weight.copy_(torch.eye(vocab))
        for token, successor in chain.items():
            model.lm_head.weight[tokenizer.convert_tokens_to_ids(successor),
                                 tokenizer.convert_tokens_to_ids(token)] = 1.0
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


@pytest.fixture(scope="module", params=list(CHAINS))
def ernie(request, tmp_path_factory):
    """(reasoning parser name, model directory, HF's model) for each parser."""
    folder = tmp_path_factory.mktemp(request.param)
    model = _save_chain_model(folder, _tokenizer(), CHAINS[request.param])
    return request.param, str(folder), model


@pytest.mark.parametrize("thinking", [True, False])
def test_chat_splits_reasoning_from_the_answer(ernie, thinking):
    parser, folder, hf_model = ernie
    llm = LLM(model=folder, reasoning_parser=parser, dtype="float32", num_gpu_blocks_override=16)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}]
    output = llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False,
                      chat_template_kwargs={"enable_thinking": thinking})[0]
    prompt = output.prompt
    assert prompt.startswith("<|begin_of_sentence|>Be brief.\nUser: Capital of France?\nAssistant: ")
    assert prompt.endswith("<think>" if thinking else "<think>\n\n</think>\n\n")
    assert output.outputs.reasoning_content == ("Because" if thinking else "")
    assert output.outputs.text == "Paris"
    assert output.outputs.finish_reason == "stop"
    assert output.outputs.token_ids == hf_greedy(hf_model, output.prompt_token_ids, 12)[:len(output.outputs.token_ids)]
