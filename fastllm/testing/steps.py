"""The order of an engine's step calls, for tests of async scheduling (what overlaps what)."""

from __future__ import annotations

from typing import Any, Optional

from fastllm.worker.pending_step import PendingStep
from fastllm.worker.scheduler_output import SchedulerOutput


class StepLog:
    """Wraps an executor's ``execute_model`` and ``sample_tokens`` and each step's ``results``.

    ``events`` holds ``("execute", n)``, ``("sample", n)`` (the step is queued) and
    ``("read", n)`` in the order they happen, ``n`` numbering the steps from 0;
    ``outputs[n]`` is step n's SchedulerOutput.
    """

    def __init__(self, executor: Any):
        self.events: list[tuple[str, int]] = []
        self.outputs: list[SchedulerOutput] = []
        self._executor = executor
        self._execute, self._sample = executor.execute_model, executor.sample_tokens
        executor.execute_model, executor.sample_tokens = self._execute_model, self._sample_tokens

    def restore(self) -> None:
        self._executor.execute_model, self._executor.sample_tokens = self._execute, self._sample

    def _execute_model(self, scheduler_output: SchedulerOutput) -> None:
        self.events.append(("execute", len(self.outputs)))
        self.outputs.append(scheduler_output)
        self._execute(scheduler_output)

    def _sample_tokens(self, grammar: Optional[Any] = None) -> PendingStep:
        number = len(self.outputs) - 1
        pending = self._sample(grammar)
        self.events.append(("sample", number))
        results = pending.results
        pending.results = lambda: (self.events.append(("read", number)), results())[1]
        return pending

    @property
    def num_steps(self) -> int:
        return len(self.outputs)

    def read_inside(self) -> list[bool]:
        """Per step, whether the step before it was read between its forward pass and its sampling."""
        inside = []
        for n in range(self.num_steps):
            start, end = self.events.index(("execute", n)), self.events.index(("sample", n))
            inside.append(("read", n - 1) in self.events[start:end])
        return inside
