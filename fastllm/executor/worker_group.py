"""Rank 0's side of tensor parallelism: the worker processes, their pipes, a watch on their lives."""

from __future__ import annotations

import logging
import multiprocessing as mp
import pickle
import threading
import time
from multiprocessing.connection import Connection, wait
from typing import Any, Optional

import torch

from fastllm.distributed.process_group import (abort_tensor_parallel, destroy_tensor_parallel,
                                               init_tensor_parallel)
from fastllm.executor.worker import SHUTDOWN, WorkerSpec, run_worker

logger = logging.getLogger("fastllm")
JOIN_TIMEOUT_S = 10.0


class WorkerError(RuntimeError):
    """A tensor-parallel worker failed or died: the engine cannot take another step."""


class WorkerGroup:
    """Spawns ranks 1..N-1, joins the process group as rank 0, and sends the workers calls.

    A call is pickled once and written to every worker's pipe. Step calls get no reply, so
    a step costs rank 0 one pickle and N-1 pipe writes; set-up calls wait for every reply.
    A watcher thread notices a worker's death at once: it aborts NCCL collectives that
    would otherwise wait for the dead rank forever (gloo fails them by itself), and rank 0's
    next call raises WorkerError with the worker's traceback or exit code.
    """

    def __init__(self, specs: list[WorkerSpec], device: torch.device):
        self.procs: list[mp.process.BaseProcess] = []
        self.conns: list[Connection] = []
        self.error: Optional[str] = None
        self.closed = False
        self._lock = threading.Lock()
        self._threads = torch.get_num_threads()  # rank 0 takes a share of the cores while the group lives
        try:
            self._start(specs)
            threading.Thread(target=self._watch, name="fastllm-tp-watch", daemon=True).start()
            self.gather()  # every worker got past its imports: joining the group cannot wait on a corpse
            first = specs[0]
            init_tensor_parallel(0, first.world_size, first.init_method, first.backend, device,
                                 first.config.pipeline_parallel_size, first.config.enable_expert_parallel,
                                 first.expert_all_to_all_min_tokens)
        except BaseException:
            self.shutdown()
            raise

    def _start(self, specs: list[WorkerSpec]) -> None:
        """Start the workers, appending each one's process and rank 0's end of its connection."""
        ctx = mp.get_context("spawn")
        for spec in specs:
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=run_worker, args=(spec, theirs), name=f"fastllm-tp-rank{spec.rank}",
                               daemon=True)
            proc.start()
            theirs.close()
            self.procs.append(proc)
            self.conns.append(ours)

    # ---- calls ----------------------------------------------------------------------------
    def call(self, method: str, *args: Any) -> None:
        """Have every worker run ``Worker.<method>(*args)``; returns without waiting."""
        self._send(pickle.dumps((method, args, False), protocol=pickle.HIGHEST_PROTOCOL))

    def request(self, method: str, *args: Any) -> None:
        """Like ``call``, but each worker replies: collect the replies with ``gather``."""
        self._send(pickle.dumps((method, args, True), protocol=pickle.HIGHEST_PROTOCOL))

    def gather(self) -> list[Any]:
        """One reply from each worker, in rank order; raises WorkerError if one failed instead."""
        return [self._receive(index) for index in range(len(self.conns))]

    def check(self) -> None:
        """Raise WorkerError if any worker has failed or died since the last call; never blocks."""
        for index, conn in enumerate(self.conns):
            if conn.poll():
                self._receive(index)  # nothing is owed to rank 0 between calls: an error or EOF
        if self.error:
            raise WorkerError(self.error)

    def _send(self, payload: bytes) -> None:
        self.check()
        for conn, proc in zip(self.conns, self.procs):
            try:
                conn.send_bytes(payload)
            except OSError:
                raise self._fail(f"{proc.name} exited with code {self._exitcode(proc)}") from None

    def _receive(self, index: int) -> Any:
        conn, proc = self.conns[index], self.procs[index]
        wait([conn, proc.sentinel])
        try:
            status, value = conn.recv()  # a dead worker's last words are still in the pipe
        except (EOFError, OSError):
            raise self._fail(f"{proc.name} exited with code {self._exitcode(proc)}") from None
        if status == "error":
            raise self._fail(f"{proc.name} failed:\n{value}")
        return value

    def _fail(self, message: str) -> WorkerError:
        self.error = self.error or message
        return WorkerError(self.error)

    @staticmethod
    def _exitcode(proc: mp.process.BaseProcess) -> Optional[int]:
        """The code once known; a join that races the watcher thread's reaping sees None, so retry."""
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        while proc.exitcode is None and time.monotonic() < deadline:
            proc.join(0.05)
        return proc.exitcode

    # ---- lifetime ---------------------------------------------------------------------------
    def _watch(self) -> None:
        ready = wait([proc.sentinel for proc in self.procs])
        with self._lock:
            if self.closed:
                return
            dead = next(proc for proc in self.procs if proc.sentinel in ready)
            dead.join(JOIN_TIMEOUT_S)  # reap it, so that its exit code is known
            logger.error("tensor-parallel worker %s exited with code %s", dead.name, dead.exitcode)
            self.error = self.error or f"{dead.name} exited with code {dead.exitcode}"
            abort_tensor_parallel()

    def shutdown(self) -> None:
        """Stop every worker and leave the process group; idempotent, and run at exit."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        payload = pickle.dumps((SHUTDOWN, (), False))
        for conn in self.conns:
            try:
                conn.send_bytes(payload)
            except OSError:
                pass  # that worker is already gone
        for proc in self.procs:
            proc.join(JOIN_TIMEOUT_S)
            if proc.is_alive():  # stuck in a collective that rank 0 will never join
                proc.kill()
                proc.join()
        for conn in self.conns:
            conn.close()
        destroy_tensor_parallel()
        torch.set_num_threads(self._threads)
