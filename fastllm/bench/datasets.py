"""Benchmark prompts: random token ids of given lengths, or ShareGPT-format conversations."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class BenchRequest:
    prompt_token_ids: list[int]
    output_len: int


def random_requests(num: int, input_len: int, output_len: int, vocab_size: int,
                    range_ratio: float = 0.0, seed: int = 0) -> list[BenchRequest]:
    """Lengths drawn uniformly in [len * (1 - range_ratio), len * (1 + range_ratio)]."""
    rng = random.Random(seed)

    def draw(n: int) -> int:
        return max(1, rng.randint(int(n * (1 - range_ratio)), int(n * (1 + range_ratio))))

    return [BenchRequest([rng.randrange(10, vocab_size - 10) for _ in range(draw(input_len))], draw(output_len))
            for _ in range(num)]


def sharegpt_requests(path: str, num: int, tokenizer: Any, max_len: int,
                      output_len: Optional[int] = None, seed: int = 0) -> list[BenchRequest]:
    """First human turn as prompt; the recorded answer's length as output length."""
    with open(path) as f:
        data = json.load(f)
    random.Random(seed).shuffle(data)
    requests = []
    for item in data:
        turns = item.get("conversations") or item.get("conversation") or []
        if len(turns) < 2:
            continue
        prompt = tokenizer(turns[0]["value"])["input_ids"]
        answer = output_len or len(tokenizer(turns[1]["value"])["input_ids"])
        if len(prompt) < 4 or answer < 4 or len(prompt) + answer > max_len:
            continue
        requests.append(BenchRequest(prompt, answer))
        if len(requests) == num:
            break
    return requests
