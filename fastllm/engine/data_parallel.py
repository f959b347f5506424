"""Data parallelism: N engine replicas, each a process with its own device(s), behind one engine surface.

Each replica is a whole ``LLMEngine`` (its own scheduler, KV cache and, under tensor or pipeline
parallelism, its own workers). This process only places requests and relays outputs, so replicas
step independently: ``step`` returns the outputs of whichever replicas finished a step first.

With ``enable_expert_parallel`` (MoE models: data-parallel attention, expert-parallel experts)
the replicas, one rank each, form one process group over which every MoE layer places its
experts and exchanges its tokens. Their forward passes must meet, so they step together: every
replica steps whenever any has work (an idle one runs a one-token pass), and a step ends when
all have. Before each forward pass the replicas agree on the step (one small all-gather): decode
steps pad to a common captured batch size and replay its CUDA graph on every replica, other steps
run eagerly (``fastllm.distributed.replica_step``). Each replica's engine may overlap its steps
(async scheduling): it still runs exactly one forward pass a step.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import traceback
import weakref
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Optional

import torch

from fastllm.config import EngineConfig
from fastllm.distributed.parallel_state import ep_size
from fastllm.distributed.process_group import destroy_tensor_parallel, free_tcp_port, init_replica_experts
from fastllm.engine.input_processor import RequestError
from fastllm.engine.llm_engine import LLMEngine, load_model_files, select_platform
from fastllm.engine.output_processor import OutputKind
from fastllm.executor.worker_group import JOIN_TIMEOUT_S, WorkerError
from fastllm.outputs import RequestOutput
from fastllm.platforms.step_profiler import profile_directory
from fastllm.sampling_params import SamplingParams


@dataclass
class Load:
    """What placement weighs: requests not finished (queue length), then the share of KV blocks in use."""

    num_requests: int = 0
    kv_usage: float = 0.0


def _kv_usage(engine: LLMEngine) -> float:
    return 1.0 - engine.kv_cache.num_free_blocks / engine.kv_cache.pool.num_usable_blocks


@dataclass(frozen=True)
class ExpertGroup:
    """A replica's place in the process group over which the MoE layers spread their experts."""

    rank: int
    world_size: int
    init_method: str


def run_replica(config: EngineConfig, num_threads: int, conn: Connection,
                experts: Optional[ExpertGroup] = None) -> None:
    """Process entry point: build the replica's engine, report its facts, then serve calls."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the front, which shuts replicas down
    torch.set_num_threads(num_threads)
    engine, relay = None, PromptRelay()
    try:
        if experts is not None:
            platform = select_platform(config.platform)
            init_replica_experts(experts.rank, experts.world_size, experts.init_method, platform.dist_backend,
                                 platform.device)
        engine = LLMEngine(config)
        conn.send(("ok", (engine.max_model_len, engine.dtype, ep_size())))
        while True:
            method, args = conn.recv()
            if method == "shutdown":
                break
            if method == "add_request":
                try:
                    engine.add_request(*args)
                except RequestError as exc:
                    conn.send(("rejected", (str(exc), exc.code)))
                    continue
                conn.send(("ok", None))
            elif method == "profile":
                engine.runner.profile(*args)
                conn.send(("ok", None))
            elif method == "abort_request":
                relay.prompts.pop(args[0], None)
                conn.send(("ok", engine.abort_request(*args)))
            else:  # step
                conn.send(("ok", (relay.compact(engine.step()), _kv_usage(engine))))
    except EOFError:
        pass  # the front has gone
    except BaseException:
        try:
            conn.send(("error", traceback.format_exc()))
        except OSError:
            pass
        raise SystemExit(1)
    finally:
        if engine is not None:
            engine.runner.shutdown()
            if experts is not None:  # one rank, one runner: its graphs go before their group (destroy_tensor_parallel)
                engine.runner.runner.graphs = None
        destroy_tensor_parallel()


class PromptRelay:
    """A request's prompt crosses the pipe with its first output only: a streaming request's
    outputs each carry the whole prompt, which would otherwise be pickled again every step."""

    def __init__(self) -> None:
        self.prompts: dict[str, tuple[Optional[str], list[int]]] = {}

    def compact(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """In the replica: drop the prompt from every output but a request's first."""
        for output in outputs:
            if output.request_id in self.prompts:
                output.prompt, output.prompt_token_ids = None, []
            self.prompts[output.request_id] = (None, [])
            if output.finished:
                del self.prompts[output.request_id]
        return outputs

    def restore(self, output: RequestOutput) -> RequestOutput:
        """In the front: give each output back the prompt its request's first one brought."""
        if output.request_id in self.prompts:
            output.prompt, output.prompt_token_ids = self.prompts[output.request_id]
        else:
            self.prompts[output.request_id] = (output.prompt, output.prompt_token_ids)
        if output.finished:
            del self.prompts[output.request_id]
        return output


@dataclass
class Replica:
    proc: mp.process.BaseProcess
    conn: Connection
    load: Load = field(default_factory=Load)
    owned: set[str] = field(default_factory=set)  # its requests not finished yet
    stepping: bool = False  # a step was sent and its reply not read


class ReplicaGroup:
    """The replica processes; ``shutdown`` stops them (the engine's ``runner`` role, for ``LLM.shutdown``)."""

    def __init__(self, config: EngineConfig, platform: Any):
        size = config.data_parallel_size
        per_replica = config.tensor_parallel_size * config.pipeline_parallel_size
        self.lockstep = config.enable_expert_parallel
        update: dict[str, Any] = {"data_parallel_size": 1}
        init_method = None
        if self.lockstep:
            if per_replica > 1:
                raise ValueError("data_parallel_size with enable_expert_parallel runs replicas of one GPU "
                                 "(tensor_parallel_size=1, pipeline_parallel_size=1)")
            # the experts live over the replicas, whose forward passes meet: each agrees its step with
            # the others first (``fastllm.distributed.replica_step``), decode steps replaying graphs
            update.update(enable_expert_parallel=False)
            init_method = f"tcp://127.0.0.1:{free_tcp_port()}"
        replica_config = config.model_copy(update=update)
        self.replicas: list[Replica] = []
        self.closed = False
        # the replicas are not daemons: one left running by a failed start would hang this
        # interpreter's exit, so any failure from here on stops those already started
        try:
            self._start(replica_config, platform, size, per_replica, init_method)
            self._adopt_facts([self.receive(replica)[1] for replica in self.replicas])
        except BaseException:
            self.shutdown()
            raise

    def _start(self, replica_config: EngineConfig, platform: Any, size: int, per_replica: int,
               init_method: Optional[str]) -> None:
        threads = max(1, len(os.sched_getaffinity(0)) // size)
        ctx = mp.get_context("spawn")
        devices = platform.visible_devices(size * per_replica)
        for index in range(size):
            ours, theirs = ctx.Pipe()
            # not a daemon, so that it may spawn tensor-parallel workers; it exits when told
            # (the finalizer runs before multiprocessing joins children at exit) or at EOF
            experts = ExpertGroup(index, size, init_method) if init_method else None
            proc = ctx.Process(target=run_replica, args=(replica_config, threads, theirs, experts),
                               name=f"fastllm-dp-replica{index}")
            with platform.only_devices(devices[index * per_replica:(index + 1) * per_replica]):
                proc.start()
            theirs.close()
            self.replicas.append(Replica(proc, ours))

    def _adopt_facts(self, facts: list[tuple[int, torch.dtype, int]]) -> None:
        """What every replica reported once built: (max_model_len, dtype, expert ranks)."""
        self.max_model_len = min(length for length, _, _ in facts)
        self.dtype = facts[0][1]
        self.expert_ranks = facts[0][2]  # over how many ranks each replica's MoE layers place experts

    def receive(self, replica: Replica) -> Any:
        """The replica's next reply; raises WorkerError if it failed or died instead."""
        wait([replica.conn, replica.proc.sentinel])
        try:
            status, value = replica.conn.recv()
        except (EOFError, OSError):
            replica.proc.join(JOIN_TIMEOUT_S)
            raise WorkerError(f"{replica.proc.name} exited with code {replica.proc.exitcode}") from None
        if status == "error":
            raise WorkerError(f"{replica.proc.name} failed:\n{value}")
        return status, value

    def shutdown(self) -> None:
        """Stop every replica (each stops its own workers); idempotent, and run at exit."""
        if self.closed:
            return
        self.closed = True
        for replica in self.replicas:
            try:
                replica.conn.send(("shutdown", ()))
            except OSError:
                pass  # already gone
        for replica in self.replicas:
            replica.proc.join(JOIN_TIMEOUT_S)
            if replica.proc.is_alive():
                replica.proc.kill()
                replica.proc.join()
            replica.conn.close()


class DataParallelEngine:
    """``LLMEngine``'s request surface (``add_request``, ``abort_request``, ``step``,
    ``has_unfinished_requests``) over ``data_parallel_size`` replicas; a request goes to the
    replica with the fewest unfinished requests, then the lowest KV-cache usage."""

    error_output = staticmethod(LLMEngine.error_output)

    def __init__(self, config: EngineConfig):
        self.config = config
        self.platform = select_platform(config.platform)
        self.load_format, _, self.hf_config, self.tokenizer = load_model_files(config)
        self.runner = ReplicaGroup(config, self.platform)  # stops its replicas if it fails to start
        self._finalizer = weakref.finalize(self, self.runner.shutdown)
        self.max_model_len, self.dtype = self.runner.max_model_len, self.runner.dtype
        self.replicas = self.runner.replicas
        self._owner: dict[str, Replica] = {}
        self._ready: list[RequestOutput] = []  # outputs of steps read while placing requests
        self._relay = PromptRelay()

    def add_request(self, request_id: str, prompt: Optional[str], prompt_token_ids: Optional[list[int]],
                    params: SamplingParams, arrival_time: Optional[float] = None,
                    chat_template_kwargs: Optional[dict[str, Any]] = None,
                    output_kind: OutputKind = OutputKind.CUMULATIVE,
                    lora_request: Any = None, multimodal_data: Optional[dict[str, Any]] = None,
                    tool_call_parser: Optional[str] = None) -> None:
        """``LLMEngine.add_request`` on the least-loaded replica (its adapter and media travel along)."""
        if request_id in self._owner:
            raise RequestError(f"request id {request_id!r} is already in use")
        replica = min(self.replicas, key=lambda r: (r.load.num_requests, r.load.kv_usage))
        status, value = self._call(replica, "add_request", request_id, prompt, prompt_token_ids, params,
                                   arrival_time, chat_template_kwargs, output_kind, lora_request,
                                   multimodal_data, tool_call_parser)
        if status == "rejected":
            raise RequestError(*value)
        replica.owned.add(request_id)
        replica.load.num_requests += 1
        self._owner[request_id] = replica

    def abort_request(self, request_id: str) -> Optional[RequestOutput]:
        replica = self._owner.get(request_id)
        if replica is None:
            return None
        _, output = self._call(replica, "abort_request", request_id)
        self._relay.prompts.pop(request_id, None)
        self._finish(replica, request_id)
        return output

    def has_unfinished_requests(self) -> bool:
        return bool(self._owner) or bool(self._ready)

    def start_profile(self) -> None:
        """``LLMEngine.start_profile`` on every replica (the directory checked here first: a replica
        that failed the call would stop)."""
        profile_directory()
        for replica in self.replicas:
            self._call(replica, "profile", True)

    def stop_profile(self) -> None:
        for replica in self.replicas:
            self._call(replica, "profile", False)

    def shutdown(self) -> None:
        """Stop the replicas (this process froze no heap: its engines live in theirs)."""
        self.runner.shutdown()

    def step(self) -> list[RequestOutput]:
        """Start a step on every idle replica that has requests; return the outputs of those
        that finish one first (and of any read meanwhile). In lockstep, every replica steps
        while any has requests, and the outputs come when all have finished the step."""
        if self.runner.lockstep:
            return self._step_together()
        for replica in self.replicas:
            if replica.owned and not replica.stepping:
                self._start_step(replica)
        stepping = [r for r in self.replicas if r.stepping]
        if stepping and not self._ready:
            wait([r.conn for r in stepping] + [r.proc.sentinel for r in stepping])
        for replica in stepping:
            if replica.conn.poll() or not replica.proc.is_alive():
                self._read_step(replica, restart=True)
        outputs, self._ready = self._ready, []
        return outputs

    def _step_together(self) -> list[RequestOutput]:
        if any(replica.owned for replica in self.replicas):
            for replica in self.replicas:
                if not replica.stepping:
                    self._start_step(replica)
        for replica in self.replicas:
            if replica.stepping:
                self._read_step(replica)
        outputs, self._ready = self._ready, []
        return outputs

    def _start_step(self, replica: Replica) -> None:
        replica.conn.send(("step", ()))
        replica.stepping = True

    def _call(self, replica: Replica, method: str, *args: Any) -> tuple[str, Any]:
        """A call that waits for its reply; a step in flight on that replica is read first."""
        if replica.stepping:
            self._read_step(replica)
        try:
            replica.conn.send((method, args))
        except OSError:
            pass  # dead: receive reports how
        return self.runner.receive(replica)

    def _read_step(self, replica: Replica, restart: bool = False) -> None:
        """``restart``: a replica with requests left starts its next step before its outputs are
        relayed, so that it never waits for this process's work on them."""
        _, (outputs, kv_usage) = self.runner.receive(replica)
        replica.stepping = False
        replica.load.kv_usage = kv_usage
        finished = {output.request_id for output in outputs if output.finished}
        if restart and replica.owned - finished:
            self._start_step(replica)
        for output in outputs:
            if output.finished:
                self._finish(replica, output.request_id)
            self._ready.append(self._relay.restore(output))

    def _finish(self, replica: Replica, request_id: str) -> None:
        if self._owner.pop(request_id, None) is not None:
            replica.owned.discard(request_id)
            replica.load.num_requests -= 1
