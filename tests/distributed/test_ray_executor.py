"""The Ray executor on a simulated two-node Ray cluster, over gloo on the CPU.

Each node offers one CPU and each rank takes one, so TP=2 puts its ranks on different nodes:
the result must be TP=1's greedy tokens. A rank actor killed mid-request fails the engine's
next step with WorkerError, and the process then exits by itself, leaving the cluster's
resources as it found them (no actor or placement group outlives it); so does losing the node
that holds rank 1.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
import ray
import torch.distributed as dist
from ray.cluster_utils import Cluster
from ray.util.placement_group import placement_group_table

from fastllm import SamplingParams
from fastllm.executor import WorkerError
from tests.conftest import needs_ranks
from tests.distributed.test_tensor_parallel import TINY_PROMPTS, _generate, _tiny, assert_same_outputs

pytestmark = needs_ranks(2)  # every test runs two ranks
EXIT_TIMEOUT_S = 120
RELEASE_TIMEOUT_S = 30


@pytest.fixture(scope="module")
def two_nodes():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_tp2_over_two_nodes_matches_tp1(two_nodes, tiny_llama_dir):
    params = SamplingParams(temperature=0.0, max_tokens=12, logprobs=2, prompt_logprobs=2)
    prompts = [{"prompt_token_ids": p} for p in TINY_PROMPTS]
    single = _tiny(tiny_llama_dir, 1)
    expected = _generate(single, prompts, params)
    del single
    llm = _tiny(tiny_llama_dir, 2, distributed_executor_backend="ray", async_scheduling=True)
    try:
        placement = llm.engine.runner.workers.placement
        assert len(set(placement.nodes)) == 2, "each node has one CPU: the ranks must be on different nodes"
        actual = _generate(llm, prompts, params)
    finally:
        llm.shutdown()
    assert_same_outputs(actual, expected)
    assert not dist.is_initialized()
    assert placement_group_table(placement.group)["state"] == "REMOVED"


KILL_MID_REQUEST = textwrap.dedent("""
    import sys
    import ray
    from fastllm import LLM, SamplingParams
    from fastllm.executor import WorkerError

    llm = LLM(sys.argv[1], load_format="dummy", tensor_parallel_size=2, num_gpu_blocks_override=32,
              block_size=16, max_num_batched_tokens=16, distributed_executor_backend="ray")
    engine = llm.engine
    engine.add_request("0", None, list(range(10, 50)), SamplingParams(max_tokens=64))
    engine.step()  # the request is in flight
    ray.kill(engine.runner.workers.actors[0])
    try:
        while engine.has_unfinished_requests():
            engine.step()
    except WorkerError as exc:
        print("WorkerError:", exc)
    else:
        sys.exit("the request finished although its rank 1 was killed")
""")


def test_killed_rank_actor_fails_the_step_and_the_process_exits(two_nodes, tiny_llama_dir):
    """No shutdown call: the driver exits on its own, and takes its actor and reservation along."""
    child = subprocess.run([sys.executable, "-c", KILL_MID_REQUEST, tiny_llama_dir], capture_output=True, text=True,
                           timeout=EXIT_TIMEOUT_S, env={**os.environ, "RAY_ADDRESS": two_nodes.address})
    assert child.returncode == 0, child.stderr[-3000:]
    assert "Traceback" not in child.stderr, child.stderr[-3000:]  # nothing failed on the way out
    assert "WorkerError: fastllm-tp-rank1 (Ray actor on" in child.stdout, child.stdout
    assert "exited with code 1" in child.stdout
    assert _all_cpus_free_within(RELEASE_TIMEOUT_S)


def _all_cpus_free_within(seconds: float) -> bool:
    """Whether every CPU of the cluster is free again within ``seconds`` (Ray frees a dead owner's
    actors and placement groups shortly after it exits, not at once)."""
    deadline = time.monotonic() + seconds
    while ray.available_resources().get("CPU") != ray.cluster_resources()["CPU"]:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_lost_node_fails_the_step(two_nodes, tiny_llama_dir):
    """The node holding rank 1 goes away mid-request (its raylet and workers die with it)."""
    llm = _tiny(tiny_llama_dir, 2, distributed_executor_backend="ray")
    engine = llm.engine
    placement = engine.runner.workers.placement
    lost = next(node for node in two_nodes.list_all_nodes() if node.node_id == placement.nodes[1])
    try:
        engine.add_request("0", None, TINY_PROMPTS[2], SamplingParams(max_tokens=64))
        engine.step()
        two_nodes.remove_node(lost)
        with pytest.raises(WorkerError, match="fastllm-tp-rank1 .* exited with code 1"):
            while engine.has_unfinished_requests():
                engine.step()
    finally:
        llm.shutdown()
        if lost not in two_nodes.list_all_nodes():
            two_nodes.add_node(num_cpus=1)  # the cluster of two nodes, for any test after this one
    assert not dist.is_initialized()
