"""A tensor-parallel worker process: one rank's model shard, driven by rank 0 over a pipe.

A worker never schedules or samples. It mirrors the runner calls that contain collectives
(``forward``, ``compute_logits`` or ``compute_greedy``) plus the set-up calls (KV budget, KV
allocation), in the order rank 0 makes them; its logits are thrown away, since rank 0 samples
for everyone.
"""

from __future__ import annotations

import pickle
import signal
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Optional

import torch

from fastllm import registry
from fastllm.config import EngineConfig
from fastllm.distributed.parallel_state import broadcast_input_ids, expert_all_to_all_cut
from fastllm.distributed.process_group import destroy_tensor_parallel, init_tensor_parallel
from fastllm.worker.model_runner import ModelRunner
from fastllm.executor.step_wire import Wire, decode_forward

SHUTDOWN = "shutdown"


@dataclass
class WorkerSpec:
    """Everything a spawned rank needs to build the runner rank 0 builds (all picklable)."""

    rank: int
    world_size: int
    init_method: str
    backend: str
    platform_name: str
    device_type: str
    config: EngineConfig
    hf_config: Any
    loader: Any
    dtype: torch.dtype
    device_index: Optional[int] = None  # None: the rank (every rank on this host)
    # the driver's cut, so that ranks on other nodes (Ray) take the same path
    expert_all_to_all_min_tokens: Optional[int] = field(default_factory=expert_all_to_all_cut)


class Worker:
    """The calls rank 0 makes on a worker, by name; each matches one rank 0 makes on itself."""

    def __init__(self, spec: WorkerSpec):
        if spec.device_type != "cpu":
            torch.get_device_module(spec.device_type).set_device(
                spec.rank if spec.device_index is None else spec.device_index)
        self.platform = registry.get("platforms", spec.platform_name)()
        self.config = spec.config
        init_tensor_parallel(spec.rank, spec.world_size, spec.init_method, spec.backend, self.platform.device,
                             spec.config.pipeline_parallel_size, spec.config.enable_expert_parallel,
                             spec.expert_all_to_all_min_tokens)
        self.runner = ModelRunner(spec.config, spec.hf_config, self.platform, spec.loader, spec.dtype)
        self.hidden: Optional[torch.Tensor] = None

    def forward(self, wire: Wire) -> None:
        self.runner.profiler.step()
        input_ids, positions, meta, multimodal = decode_forward(wire, self.runner.device)
        self.hidden = self.runner.forward(broadcast_input_ids(input_ids), positions, meta, multimodal)

    def adapter_call(self, method: str, *args: Any) -> None:
        """Rank 0's adapter manager call (``MirroredAdapters``); a step's batch is kept for its forward."""
        result = getattr(self.runner.adapters, method)(*args)
        if method == "prepare_step":
            self.runner.adapter_batch = result

    def profile(self, start: bool, directory: str) -> None:
        self.runner.profiler.switch(start, directory)

    def compute_logits(self, rows: list[int] | slice) -> None:
        self.runner.compute_logits(self.hidden, rows)

    def compute_greedy(self, rows: list[int] | slice) -> None:
        self.runner.compute_greedy(self.hidden, rows)

    def allocate_kv_cache(self, num_blocks: int, step_tokens: int) -> None:
        self.runner.allocate_kv_cache(num_blocks, step_tokens)

    def kv_cache_budget(self, num_tokens: int, max_model_len: int, max_num_seqs: int) -> int:
        """This rank's KV budget, profiled in step with rank 0's profile (it has collectives)."""
        return self.platform.kv_cache_budget(
            lambda: self.runner.profile_peak_bytes(num_tokens, max_model_len, max_num_seqs), self.config)


def run_worker(spec: WorkerSpec, conn: Connection) -> None:
    """Process entry point: report in, build the shard, then serve calls until told to stop.

    Replies are ``("ok", value)`` or ``("error", traceback)``; an error ends the process. The
    first reply comes before joining the process group (the imports worked), the second
    once the shard is built.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to rank 0, which shuts workers down
    worker = None
    try:
        conn.send(("ok", None))
        worker = Worker(spec)
        conn.send(("ok", None))
        with torch.inference_mode():
            while True:
                method, args, wants_reply = pickle.loads(conn.recv_bytes())
                if method == SHUTDOWN:
                    break
                result = getattr(worker, method)(*args)
                if wants_reply:
                    conn.send(("ok", result))
    except EOFError:
        pass  # rank 0 has gone: nobody is left to drive this rank
    except BaseException:
        _report(conn, traceback.format_exc())
        raise SystemExit(1)
    finally:
        if worker is not None:
            worker.runner.graphs = None
        destroy_tensor_parallel()


def _report(conn: Connection, error: str) -> None:
    try:
        conn.send(("error", error))
    except OSError:
        pass  # rank 0 closed its end; its own watch reports this rank's exit
