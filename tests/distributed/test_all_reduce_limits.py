"""The barrier-free all-reduce's size limit, as the environment sets it (the kernel itself runs on GPUs only)."""

from __future__ import annotations

import pytest

from fastllm.platforms.symmetric_all_reduce import LAMPORT_MAX_BYTES, LAMPORT_MAX_KIB_ENV, barrier_free_max_bytes


def test_the_limit_defaults_moves_and_turns_off(monkeypatch):
    monkeypatch.delenv(LAMPORT_MAX_KIB_ENV, raising=False)
    monkeypatch.delenv("FASTLLM_LAMPORT_ALL_REDUCE", raising=False)
    assert barrier_free_max_bytes() == LAMPORT_MAX_BYTES == 4 * 1024 * 1024
    monkeypatch.setenv(LAMPORT_MAX_KIB_ENV, "256")
    assert barrier_free_max_bytes() == 256 * 1024
    monkeypatch.setenv("FASTLLM_LAMPORT_ALL_REDUCE", "0")
    assert barrier_free_max_bytes() == 0


@pytest.mark.parametrize("value", ["4M", "-1", "1.5", ""])
def test_a_limit_that_is_not_whole_kib_is_refused(monkeypatch, value):
    monkeypatch.setenv(LAMPORT_MAX_KIB_ENV, value)
    with pytest.raises(ValueError, match=LAMPORT_MAX_KIB_ENV):
        barrier_free_max_bytes()
