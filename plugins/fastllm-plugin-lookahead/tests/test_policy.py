"""Adaptivity: failing drafts back off to none (with ever rarer probes); a batch shares a budget."""

from __future__ import annotations

import itertools

from fastllm_lookahead.policy import AcceptanceTracker, share_drafts


def drive(tracker: AcceptanceTracker, steps: int, accept: bool) -> list[int]:
    """What the tracker allows each step when every proposed draft holds (or none does)."""
    allowed = []
    for _ in range(steps):
        k, _ = tracker.allowed()
        allowed.append(k)
        tracker.update(k, k if accept else 0)
    return allowed


def test_a_new_sequence_starts_with_a_few_drafts_and_climbs_on_success():
    tracker = AcceptanceTracker(max_drafts=6, min_chain_prob=0.3)
    assert drive(tracker, 20, accept=True) == [3] + [6] * 19


def test_failing_drafts_stop_and_probes_grow_rare():
    tracker = AcceptanceTracker(max_drafts=6, min_chain_prob=0.3)
    allowed = drive(tracker, 300, accept=False)
    assert allowed[:2] == [3, 0] and allowed[5:].count(0) > 280
    probes = [i for i, k in enumerate(allowed) if k and i >= 5]
    gaps = [b - a for a, b in itertools.pairwise(probes)]
    assert gaps == sorted(gaps) and gaps[-1] >= 32
    assert sum(allowed[100:]) <= 4  # at most one draft token every 32 steps once settled


def test_a_successful_probe_brings_drafts_back():
    tracker = AcceptanceTracker(max_drafts=6, min_chain_prob=0.3)
    drive(tracker, 100, accept=False)
    allowed = drive(tracker, 80, accept=True)
    first = next(i for i, k in enumerate(allowed) if k)
    assert allowed[first + 8:] == [6] * len(allowed[first + 8:])


def test_only_the_drafts_of_a_backed_off_sequence_are_probes():
    tracker = AcceptanceTracker(max_drafts=6, min_chain_prob=0.3)
    assert tracker.allowed() == (3, False)
    tracker.update(3, 0)
    seen = []
    for _ in range(4):
        seen.append(tracker.allowed())
        assert tracker.allowed() == seen[-1]  # asking changes nothing: only steps count
        tracker.update(0, 0)
    assert seen == [(0, False)] * 3 + [(1, True)]
    assert tracker.allowed() == (1, True)  # a probe waits until it is made


def test_partial_acceptance_settles_between():
    tracker = AcceptanceTracker(max_drafts=6, min_chain_prob=0.3)
    for _ in range(50):
        k, _ = tracker.allowed()
        tracker.update(k, min(k, 1))  # the first draft always holds, the second never
    assert 1 <= tracker.allowed()[0] <= 2


def test_share_drafts_caps_each_sequence_and_the_step():
    assert share_drafts([6, 6, 3], [0.9, 0.5, 0.1], 64) == [6, 6, 3]
    many = share_drafts([6] * 40, [i / 40 for i in range(40)], 64)
    assert sum(many) <= 64 and max(many) == 1
    few = share_drafts([6] * 100, [i / 100 for i in range(100)], 64)
    assert sum(few) == 64 and few[-64:] == [1] * 64 and few[:36] == [0] * 36
