"""Fair admission: a group's requests enter a window at a time, held ones enter round-robin."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from fastllm.engine.fair_admission import FairAdmission
from fastllm.sampling_params import SamplingParams


@dataclass
class Item:
    request_id: str
    group: Optional[str]
    params: SamplingParams = field(default_factory=SamplingParams)


def test_a_group_enters_a_window_at_a_time_and_others_round_robin():
    admission = FairAdmission(window=2)
    big = [Item(f"big-{i}", "big") for i in range(6)]
    assert [admission.offer(item) for item in big] == [True, True, False, False, False, False]
    other = [Item(f"other-{i}", "other") for i in range(3)]
    assert [admission.offer(item) for item in other] == [True, True, False]
    assert admission.offer(Item("alone", None)) and admission.num_held == 5
    assert [i.request_id for i in admission.leave("big-0")] == ["big-2"]
    assert [i.request_id for i in admission.leave("other-0")] == ["other-2"]
    assert admission.leave("alone") == [] and admission.leave("no-such") == []
    assert admission.withdraw("big-4").request_id == "big-4" and admission.withdraw("big-4") is None
    assert [i.request_id for i in admission.leave("big-1")] == ["big-3"]
    assert [i.request_id for i in admission.leave("big-2")] == ["big-5"]
    assert admission.num_held == 0 and list(admission.held()) == []


def test_a_request_with_more_samples_than_the_window_still_enters_alone():
    admission = FairAdmission(window=2)
    wide = Item("wide", "g", SamplingParams(n=5))
    assert admission.offer(wide) and not admission.offer(Item("next", "g"))
    assert [i.request_id for i in admission.leave("wide")] == ["next"]
