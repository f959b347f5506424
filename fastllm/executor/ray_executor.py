"""Tensor x pipeline parallelism over a Ray cluster: ranks 1..N-1 are Ray actors, on any node.

Ray only places and watches the rank processes. Each actor runs the worker loop a spawned
process runs (``run_worker``), fed by rank 0 over an authenticated socket instead of a pipe,
so a step costs what it costs the multiprocessing executor; the model's collectives go over
NCCL between GPUs and gloo on CPUs, as on one host. A placement group holds one bundle (one
GPU, or one CPU) per rank, all on rank 0's node when it has room (STRICT_PACK), else packed on
as few nodes as possible with each node's ranks consecutive, so that a stage's tensor-parallel
group shares a node. An actor whose loop ends early, whose process dies or whose node is lost
fails the engine's next call with WorkerError, as a dead worker process does.
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import threading
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection, Listener, Pipe, wait
from typing import Any, Optional

import torch

from fastllm.distributed.process_group import free_tcp_port
from fastllm.executor.multiproc import MultiprocExecutor
from fastllm.executor.worker import WorkerSpec, run_worker
from fastllm.executor.worker_group import WorkerGroup

try:
    import ray
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("distributed_executor_backend='ray' needs Ray: pip install 'fastllm[ray]'") from exc

logger = logging.getLogger("fastllm")
START_TIMEOUT_S = float(os.environ.get("FASTLLM_RAY_START_TIMEOUT_S", "300"))  # placement and actor start


@dataclass
class Placement:
    """A placement group and, per rank, its bundle index and node."""

    group: Any
    bundles: list[int]
    nodes: list[str]
    resource: str  # "GPU" or "CPU": what one bundle holds one of
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            remove_placement_group(self.group)


def connect() -> None:
    """Join the cluster at ``RAY_ADDRESS`` (or the one ``ray start`` left on this host), else start
    a local one; a Ray the caller initialised already is used as it is."""
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS"), log_to_driver=False)


def place_ranks(world: int, device_type: str) -> Placement:
    """Reserve one bundle per rank and order the ranks: rank 0 on this (the driver's) node, then
    node by node."""
    resource = "CPU" if device_type == "cpu" else "GPU"
    here = ray.get_runtime_context().get_node_id()
    room = {node["NodeID"]: node["Resources"].get(resource, 0) for node in ray.nodes() if node["Alive"]}
    if sum(room.values()) < world:
        raise ValueError(f"tensor_parallel_size x pipeline_parallel_size={world} needs {world} {resource}s (one per "
                         f"rank); the Ray cluster has {sum(room.values()):g}")
    bundles = [{resource: 1.0} for _ in range(world)]
    strategy = "STRICT_PACK" if room.get(here, 0) >= world else "PACK"
    group = placement_group(bundles, strategy=strategy, name=f"fastllm-{secrets.token_hex(4)}")
    ready, _ = ray.wait([group.ready()], timeout=START_TIMEOUT_S)
    if not ready:
        remove_placement_group(group)
        raise RuntimeError(f"the Ray cluster could not place {world} ranks of one {resource} each within "
                           f"{START_TIMEOUT_S:.0f} s ({resource} per live node: {sorted(room.values())})")
    on_node = placement_group_table(group)["bundles_to_node_id"]
    order = sorted(range(world), key=lambda index: (on_node[index] != here, on_node[index], index))
    return Placement(group, order, [on_node[index] for index in order], resource)


def _gpu_ids() -> list[str]:
    return [str(gpu) for gpu in ray.get_gpu_ids()]


class RankActor:
    """One rank's process: waits for rank 0's connection, then serves it like a spawned worker."""

    def __init__(self, authkey: bytes):
        self.listener = Listener((ray.util.get_node_ip_address(), 0), authkey=authkey)

    def address(self) -> tuple[str, int]:
        return self.listener.address

    def serve(self, spec: WorkerSpec) -> None:
        conn = self.listener.accept()
        self.listener.close()
        run_worker(spec, conn)


class ActorProcess:
    """A rank actor seen as the process ``WorkerGroup`` watches: a name, a ``sentinel`` that
    turns readable once the actor's loop is over (it returned, raised, or the actor or its node
    died), and join / is_alive / kill / exitcode (0 when the loop returned, else 1)."""

    def __init__(self, actor: Any, loop: Any, name: str):
        self.actor, self.name = actor, name
        self.exitcode: Optional[int] = None
        self.sentinel, self._ended = Pipe(duplex=False)
        self._done = threading.Event()
        threading.Thread(target=self._follow, args=(loop,), name=f"{name}-watch", daemon=True).start()

    def _follow(self, loop: Any) -> None:
        try:
            ray.get(loop)
            self.exitcode = 0
        except Exception as exc:  # the actor raised or died; Ray says which
            logger.error("%s ended: %s", self.name, str(exc).strip().splitlines()[0])
            self.exitcode = 1
        self._ended.close()
        self._done.set()

    def join(self, timeout: Optional[float] = None) -> None:
        self._done.wait(timeout)

    def is_alive(self) -> bool:
        return not self._done.is_set()

    def kill(self) -> None:
        ray.kill(self.actor, no_restart=True)


class RayWorkerGroup(WorkerGroup):
    """``WorkerGroup`` whose workers are rank actors in ``placement``'s bundles."""

    def __init__(self, specs: list[WorkerSpec], device: torch.device, placement: Placement):
        self.placement = placement
        self.actors: list[Any] = []
        super().__init__(specs, device)

    def _start(self, specs: list[WorkerSpec]) -> None:
        authkey = secrets.token_bytes(32)
        options = {"num_cpus": 1} if self.placement.resource == "CPU" else {"num_cpus": 0, "num_gpus": 1}
        actor_class = ray.remote(RankActor)
        for spec in specs:
            strategy = PlacementGroupSchedulingStrategy(self.placement.group, self.placement.bundles[spec.rank])
            self.actors.append(actor_class.options(scheduling_strategy=strategy, **options).remote(authkey))
        addresses = ray.get([actor.address.remote() for actor in self.actors], timeout=START_TIMEOUT_S)
        for spec, actor, address in zip(specs, self.actors, addresses):
            loop = actor.serve.remote(spec)
            self.procs.append(ActorProcess(actor, loop, f"fastllm-tp-rank{spec.rank} (Ray actor on {address[0]})"))
            self.conns.append(Client(address, authkey=authkey))

    def _receive(self, index: int) -> Any:
        """As for a process, but a lost node may never close its socket: an ended loop is enough."""
        conn: Connection = self.conns[index]
        proc = self.procs[index]
        wait([conn, proc.sentinel])
        if not conn.poll():
            raise self._fail(f"{proc.name} exited with code {self._exitcode(proc)}")
        return super()._receive(index)

    def shutdown(self) -> None:
        """The workers' loops end as on one host; then their actors and the reservation go."""
        super().shutdown()
        if not ray.is_initialized():  # at exit Ray may have gone first, and took them along
            return
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.placement.release()


class RayExecutor(MultiprocExecutor):
    """``MultiprocExecutor`` with ranks 1..N-1 as Ray actors; this process stays rank 0."""

    def __init__(self, *args: Any):
        super().__init__(*args)
        # at exit, before Ray's own exit hook (registered earlier) kills the actors mid-loop
        atexit.register(self._finalizer)

    def _start_workers(self, hf_config: Any, loader: Any, dtype: torch.dtype) -> WorkerGroup:
        connect()
        world = self.config.tensor_parallel_size * self.config.pipeline_parallel_size
        placement = place_ranks(world, self.platform.device.type)
        try:
            if placement.resource == "GPU":
                self._use_rank0_gpu(placement)
            init_method = f"tcp://{ray.util.get_node_ip_address()}:{free_tcp_port()}"
            device_index = None if placement.resource == "CPU" else 0  # Ray shows each actor its GPU only
            return RayWorkerGroup(self._worker_specs(init_method, hf_config, loader, dtype, device_index),
                                  self.platform.device, placement)
        except BaseException:
            placement.release()
            raise

    def _use_rank0_gpu(self, placement: Placement) -> None:
        """Rank 0 runs here, on the GPU that Ray reserved for its bundle (so no actor gets it too)."""
        if placement.nodes[0] != ray.get_runtime_context().get_node_id():
            raise RuntimeError("this node has no free GPU for rank 0: the engine process must run on a node "
                               "of the Ray cluster with a GPU that Ray has not given out")
        strategy = PlacementGroupSchedulingStrategy(placement.group, placement.bundles[0])
        gpu = ray.get(ray.remote(_gpu_ids).options(num_cpus=0, num_gpus=1, scheduling_strategy=strategy).remote(),
                      timeout=START_TIMEOUT_S)[0]
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        index = visible.split(",").index(gpu) if visible else int(gpu)
        torch.get_device_module(self.platform.device.type).set_device(index)
        self.platform.device = torch.device(self.platform.device.type, index)
