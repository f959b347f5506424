"""Owns the model, its KV cache, the sampler and its sequences' state; runs one scheduled step
(``execute_model`` then ``sample_tokens``) and returns its tokens."""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.distributed as dist

from fastllm import registry
from fastllm.attention.metadata import AttentionMetadata, ForwardContext, forward_context
from fastllm.config import EngineConfig
from fastllm.distributed.expert_dispatch import replica_token_counts
from fastllm.distributed.parallel_state import (ep_size, experts_over_replicas, is_last_stage, logits_to_driver,
                                                pp_size, sums_by_copy, tp_group, tp_size)
from fastllm.distributed.replica_step import ReplicaPlan, agree_step, padding_rows
from fastllm.layers.fused import use_kernels
from fastllm.multimodal.inputs import StepMultimodal
from fastllm.outputs import Logprobs
from fastllm.platforms.copy_engine_sums import copy_engine_sums
from fastllm.platforms.cuda_graphs import DecodeGraphs
from fastllm.platforms.step_profiler import StepProfiler
from fastllm.platforms.transfer import to_device
from fastllm.quantization import build_quantizer, load_weights
from fastllm.sampling.batch import SamplingBatch, SamplingRow
from fastllm.sampling.sampler import GrammarMask, Sampler
from fastllm.sampling_params import SamplingParams
from fastllm.spec_decode.verify import DraftGroup, verify_drafts
from fastllm.worker.encoder_cache import EncoderRunner
from fastllm.worker.gc_heap import freeze_startup_heap, thaw_heap
from fastllm.worker.input_batch import (InputBatch, ModelInputs, SampledTokens, ScheduledRow, SequenceState,
                                        pack_inputs)
from fastllm.worker.micro_batches import micro_batch_count, split_step
from fastllm.worker.pending_step import PendingStep, SampledRows, SequenceResult
from fastllm.worker.scheduler_output import SchedulerOutput

logger = logging.getLogger(__name__)
PROMPT_LOGPROB_CHUNK = 256


@dataclass
class QueuedLogits:
    """A step between ``execute_model`` and ``sample_tokens``: its sampling rows' logits, queued.

    ``owners``: each sampling sequence's row and its first logits row; ``row_drafts``: per
    logits row, its sequence and the drafts before it."""

    results: dict[int, SequenceResult]
    logits: Optional[torch.Tensor] = None
    greedy: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # tokens and logprobs, where no row needs logits
    owners: list[tuple[ScheduledRow, int]] = field(default_factory=list)
    row_drafts: list[tuple[SequenceState, list[int]]] = field(default_factory=list)


def _rows(hidden: torch.Tensor, rows: list[int] | slice) -> torch.Tensor:
    return hidden[rows if isinstance(rows, slice) else to_device(rows, torch.int64, hidden.device)]


class ModelRunner:
    def __init__(self, config: EngineConfig, hf_config: Any, platform: Any, loader: Any, dtype: torch.dtype):
        thaw_heap(collect=True)  # another runner in this process: a dropped earlier one goes first
        self.config, self.hf_config, self.platform = config, hf_config, platform
        # ``seed``: dummy weights and unseeded requests' sampling repeat from run to run.
        random.seed(config.seed)
        torch.manual_seed(config.seed)
        self.device, self.dtype = platform.device, dtype
        self.block_size = config.block_size
        self.input_batch = InputBatch()
        kernels = platform.kernels()
        self.sampler = Sampler(kernels)
        architectures = getattr(hf_config, "architectures", None)
        if not architectures:
            raise ValueError("the model's config names no architecture (config.json 'architectures'): "
                             f"registered models are {', '.join(registry.names('models'))}")
        model_cls = registry.get("models", architectures[0])
        self.backend = registry.get("attention_backends",
                                    config.attention_backend or platform.default_attention_backend)(platform)
        quantizer = build_quantizer(config.quantization, hf_config)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device(self.device), use_kernels(kernels):
                self.model = model_cls(hf_config)
        finally:
            torch.set_default_dtype(previous)
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.num_blocks = 0
        self.model.eval()
        self.adapter_batch: Any = None  # this step's adapters, as the adapter manager packed them
        # prefill-sized tensor-parallel steps sum their partials by copy engine (platforms/copy_engine_sums.py)
        self.copy_sums = (copy_engine_sums(tp_group(), self.device, config.max_num_batched_tokens,
                                           hf_config.hidden_size, dtype,
                                           getattr(getattr(self.model, "model", None), "sequence_parallel", False))
                          if self._sums_by_copy_apply() else None)
        load_weights(loader, config.model, self.model, quantizer, config.quantize_lm_head, self.run_prompts)
        if config.merge_lora:
            registry.only("adapter_managers", "merge_lora").factory.merge(self.model, config.merge_lora)
        # The adapter manager wraps the loaded (and quantized) layers; it reads each step's slots.
        with use_kernels(kernels):
            self.adapters = (registry.only("adapter_managers", "enable_lora").factory(self.model, config)
                             if config.enable_lora else None)
        self.encoder = EncoderRunner(self.model, self.device) if hasattr(self.model, "encode_multimodal") else None
        self.graphs: Optional[Any] = None  # the platform's captured decode steps
        self.replica_rows: Optional[torch.Tensor] = None  # lockstep replicas: each one's real rows, padded steps
        self.last_sampled: Optional[SampledTokens] = None
        self.last_batch: Optional[SamplingBatch] = None  # its columns serve a step of the same rows
        self.queued: Optional[QueuedLogits] = None
        # tensor-parallel greedy rows reduce each vocabulary shard in place (``FASTLLM_GREEDY_OVER_SHARDS=0``: off)
        self.greedy_over_shards = (tp_size() > 1 and pp_size() == 1 and hasattr(self.model, "compute_greedy")
                                   and os.environ.get("FASTLLM_GREEDY_OVER_SHARDS", "1") != "0")
        self.profiler = StepProfiler(self.device)  # steps are counted by execute_model (or a worker's forward)

    def _sums_by_copy_apply(self) -> bool:
        """Not with one GPU, pipeline or expert parallelism (their collectives are not these sums),
        adapters (LoRA adds to a partial after the GEMM that sent it) or multimodal models (their
        encoders sum other shapes). Every tensor-parallel rank decides alike (the set-up is collective)."""
        return (tp_size() > 1 and pp_size() == 1 and ep_size() == 1 and not self.config.enable_lora
                and not hasattr(self.model, "encode_multimodal"))

    # ---- KV cache -------------------------------------------------------------------------
    def kv_cache_dtype(self) -> torch.dtype:
        return {"auto": self.dtype, "fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn,
                "fp8_e5m2": torch.float8_e5m2}[self.config.kv_cache_dtype]

    def _stage_attention(self) -> list[Any]:
        """The attention of each layer this rank holds (all of them but under pipeline parallelism)."""
        layers = self.model.model.layers
        return [layers[index].self_attn for index in self.model.model.stage]

    def bytes_per_block(self) -> int:
        attn = self._stage_attention()[0]
        per_token = 2 * attn.num_kv_heads * attn.head_dim * self.kv_cache_dtype().itemsize
        return per_token * self.block_size * len(self._stage_attention())

    def allocate_kv_cache(self, num_blocks: int, step_tokens: int) -> None:
        """The serving cache; where the platform compiles kernels lazily, the warm-up, and where it
        captures graphs, the decode graphs over it (verification steps of up to
        ``num_speculative_tokens`` drafts included). Start-up ends here: its heap is frozen
        (``fastllm.worker.gc_heap``)."""
        self._allocate_caches(num_blocks)
        if self.platform.warms_up_kernels:
            self.warm_up(step_tokens)
        max_len = self.config.max_model_len or getattr(self.hf_config, "max_position_embeddings", 2048)
        max_blocks = min(num_blocks, -(-max_len // self.block_size))
        forward = self._eager_forward
        if experts_over_replicas():
            self.replica_rows = torch.zeros(dist.get_world_size(), dtype=torch.long, device=self.device)
            forward = self._padded_forward
        if self._use_graphs():
            max_drafts = (self.config.speculative_config or {}).get("num_speculative_tokens", 0)
            self.graphs = self.platform.decode_graphs(forward, self.config.max_num_seqs, max_blocks, max_len,
                                                      max_query_len=1 + max_drafts, adapters=self.adapters)
        if self.graphs is None and self._pads_eagerly():
            self.graphs = DecodeGraphs(forward, self.config.max_num_seqs, max_blocks, max_len, self.device,
                                       adapters=self.adapters)
        freeze_startup_heap()

    def _allocate_caches(self, num_blocks: int) -> None:
        attn = self._stage_attention()[0]
        shape = (num_blocks, self.block_size, attn.num_kv_heads, attn.head_dim)
        stage = self.model.model.stage
        # another stage's layers keep their slots (caches are found by layer number), empty
        self.kv_caches = [tuple(torch.zeros(shape if index in stage else (0,), dtype=self.kv_cache_dtype(),
                                            device=self.device) for _ in range(2))
                          for index in range(len(self.model.model.layers))]
        self.num_blocks = num_blocks

    @torch.inference_mode()
    def warm_up(self, step_tokens: int) -> None:
        """Run a decode beside an extend of 1, 2, 4 .. tokens, up to steps of ``step_tokens``, so
        that every kernel variant a step can pick by its size (attention by query length, an MoE
        layer's grouped-GEMM tiles by the tokens an expert gets) is compiled before the first
        request: a first compilation mid-serving stalls the whole batch for a second or more. The
        blocks written hold no sequence yet, and real ones overwrite a slot before reading it.
        Last, a full step of 16 sequences: sizes that divide by 16 compile other kernel variants,
        and the largest activations are allocated here, not in the first busy step."""
        steps = [[(2, 1), (2 ** i + 1, 2 ** i)] for i in range(max(1, step_tokens - 1).bit_length())]
        if step_tokens > 16:
            steps.append([(2, 1)] * 15 + [(step_tokens - 14, step_tokens - 15)])
        for shapes in steps:
            blocks = sum(-(-context // self.block_size) for context, _ in shapes)
            if 1 + blocks > self.num_blocks:  # block 0 is never used
                continue
            inputs = self._dummy_inputs(shapes)
            self._eager_forward(inputs.input_ids, inputs.positions, inputs.attn_metadata)

    @torch.inference_mode()
    def idle_step(self) -> None:
        """One token through the model in block 0, which no sequence owns: a data-parallel
        replica with nothing scheduled keeps step with the others, whose MoE layers exchange
        tokens with it every step (in a padded step its row is padding; where no replica has
        work, none runs it)."""
        inputs = self._dummy_inputs([(1, 1)], first_block=0)
        self.adapter_batch = None
        self._forward_in_lockstep(inputs.input_ids, inputs.positions, inputs.attn_metadata, work=False)

    def _dummy_inputs(self, shapes: list[tuple[int, int]], token_ids: Optional[list[int]] = None,
                      first_block: int = 1) -> ModelInputs:
        """A step of sequences given as (context length, new tokens), on consecutive blocks from
        ``first_block``; their tokens are ``token_ids`` one after another, or all 1."""
        scheduled, next_block, used = [], first_block, 0
        for context, new in shapes:
            num_blocks = -(-context // self.block_size)
            ids = [1] * context if token_ids is None else token_ids[used:used + context]
            used += context
            seq = SequenceState(-1, "dummy", 0, ids, SamplingParams(), 0,
                                block_ids=list(range(next_block, next_block + num_blocks)),
                                num_computed_tokens=context - new)
            next_block += num_blocks
            scheduled.append(ScheduledRow(seq, new))
        return pack_inputs(scheduled, self.block_size, self.device)

    def _use_graphs(self) -> bool:
        """Unless ``enforce_eager``; the backend must be capturable. Under tensor parallelism only with
        ``tp_cuda_graphs``: every rank captures the same graphs (allocation runs on all ranks
        together) and replays the same one each step, since all ranks see the same step
        metadata. Not under pipeline parallelism, whose stages pass activations by send and
        receive."""
        return (not self.config.enforce_eager and pp_size() == 1
                and (tp_size() == 1 or self.config.tp_cuda_graphs)
                and getattr(self.backend, "cuda_graph_safe", False))

    def _pads_eagerly(self) -> bool:
        """Lockstep replicas without captured graphs (the CPU, ``enforce_eager``) whose attention
        backend could be captured run the padded common-bucket decode steps eagerly, over the
        graphs' static buffers: the path the graphs take, step for step."""
        return experts_over_replicas() and getattr(self.backend, "cuda_graph_safe", False)

    # ---- one step ---------------------------------------------------------------------------
    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> None:
        """Queue one step's forward pass and its sampling rows' logits, without waiting for them
        where the step allows; ``sample_tokens`` then samples them.

        A scheduled token that the previous step sampled and the host has not read yet is
        read on the device. Prompt logprobs need values on the host, so a step with them has
        finished when this returns. A step that verifies drafts leaves no token to read that
        way (a sequence's next token sits at the row its accepted count picks): the engine
        reads it before the next step, and it clears ``last_sampled``, so a step that needed
        it would fail rather than read older tokens. Between the two calls the engine may read
        the previous step, so the sampling rows (penalties, grammar masks) see its tokens
        while the device computes this step's logits.
        """
        self.profiler.step()
        rows = self.input_batch.update(scheduler_output)
        inputs = pack_inputs(rows, self.block_size, self.device, self.last_sampled)
        if self.adapters is not None:
            self.adapter_batch = self.adapters.prepare_step([item.seq.adapter_id for item in inputs.order],
                                                            inputs.attn_metadata.query_lens_cpu)
        multimodal = self.encoder.step_inputs(inputs) if self.encoder is not None else None
        hidden = self.forward_step(inputs, multimodal)
        results = {item.seq.seq_id: SequenceResult() for item in inputs.order}
        self._prompt_logprobs(hidden, inputs, results)
        self.queued = self._queue_logits(hidden, inputs, results)

    def forward_step(self, inputs: ModelInputs, multimodal: Optional[StepMultimodal] = None) -> torch.Tensor:
        """One step's forward; a tensor-parallel driver also sends it to its workers."""
        return self.forward(inputs.input_ids, inputs.positions, inputs.attn_metadata, multimodal)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: AttentionMetadata,
                multimodal: Optional[StepMultimodal] = None) -> torch.Tensor:
        """Hidden states of one packed batch; ``multimodal``: a step with image/video prompt tokens.

        Under tensor parallelism every rank makes this call, and each ``compute_logits``
        call, with the same inputs (rank 0's executor mirrors them): the layers' collectives
        pair up only when all ranks run the same sequence of them. Under pipeline parallelism a
        large step runs as micro-batches, so that the stages overlap (``micro_batches``). Lockstep
        data-parallel replicas agree on each step first (``_forward_in_lockstep``).
        """
        if experts_over_replicas():
            return self._forward_in_lockstep(input_ids, positions, attn_metadata, multimodal)
        if multimodal is None and self.graphs is not None and self.graphs.can_run(attn_metadata):
            return self.graphs.run(input_ids, positions, attn_metadata, self.adapter_batch)
        count = micro_batch_count(input_ids.numel(), pp_size())
        if count > 1 and multimodal is None and self.adapter_batch is None:  # adapters' slots are per token
            return torch.cat([self._eager_forward(input_ids[part.tokens].clone(),
                                                  positions[..., part.tokens].clone(), part.attn_metadata)
                              for part in split_step(attn_metadata, count, self.device)])
        return self._eager_forward(input_ids, positions, attn_metadata, multimodal)

    def _forward_in_lockstep(self, input_ids: torch.Tensor, positions: torch.Tensor,
                             attn_metadata: AttentionMetadata, multimodal: Optional[StepMultimodal] = None,
                             work: bool = True) -> Optional[torch.Tensor]:
        """A data-parallel replica whose MoE layers meet the others': the replicas agree on the
        step (``replica_step``), then all replay the decode graph of a common bucket, or all run
        eagerly with their real token counts. ``work``: False for an idle replica's dummy step;
        where no replica has work, none runs a forward (None)."""
        graphs = self.graphs
        graphable = (graphs is not None and multimodal is None and attn_metadata.max_query_len == 1
                     and graphs.fits_tables(attn_metadata))
        step = agree_step(ReplicaPlan(input_ids.shape[0], graphable, work), graphs.sizes if graphs else [],
                          self.device)
        if not step.work:
            return None
        if step.bucket is not None:
            self.replica_rows.copy_(step.real_on_device)
            return graphs.run(input_ids, positions, attn_metadata, self.adapter_batch, size=step.bucket)
        return self._eager_forward(input_ids, positions, attn_metadata, multimodal, replica_tokens=step.counts)

    def _padded_forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: AttentionMetadata,
                        adapter_batch: Any = None) -> torch.Tensor:
        """A decode graph's forward for lockstep replicas: every replica brings the graph's rows,
        its real ones (``replica_rows``, set before each replay) first."""
        rows = input_ids.shape[0]
        return self._eager_forward(input_ids, positions, attn_metadata, adapter_batch=adapter_batch,
                                   replica_tokens=[rows] * self.replica_rows.numel(),
                                   replica_padding=padding_rows(self.replica_rows, rows))

    def _eager_forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                       attn_metadata: AttentionMetadata, multimodal: Optional[StepMultimodal] = None,
                       adapter_batch: Any = None, replica_tokens: Optional[list[int]] = None,
                       replica_padding: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``adapter_batch``: a captured graph's, in place of the step's. ``replica_tokens``
        (``replica_padding``): lockstep replicas' agreed counts (and padding rows); exchanged
        here where not given (start-up passes)."""
        adapter_batch = self.adapter_batch if adapter_batch is None else adapter_batch
        if replica_tokens is None and experts_over_replicas():
            replica_tokens = replica_token_counts(input_ids.shape[0], self.device)
        with forward_context(ForwardContext(attn_metadata, self.kv_caches, self.backend, adapter_batch,
                                            replica_tokens, replica_padding)), \
                sums_by_copy(self.copy_sums, input_ids.shape[0]):
            if multimodal is not None:
                return self.model(input_ids, positions, multimodal=multimodal)
            return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor, rows: list[int] | slice) -> torch.Tensor:
        """Logits of ``hidden[rows]`` over the full vocabulary (the LM head all-gathers them)."""
        logits = self.model.compute_logits(_rows(hidden, rows)) if is_last_stage() else None
        num_rows = len(rows) if isinstance(rows, list) else rows.stop - rows.start
        return logits_to_driver(logits, (num_rows, self.hf_config.vocab_size), hidden.device)

    def compute_greedy(self, hidden: torch.Tensor, rows: list[int] | slice) -> tuple[torch.Tensor, torch.Tensor]:
        """The argmax token and its logprob of each of ``hidden[rows]``, every rank's vocabulary
        shard reduced where it is (``compute_logits``' all-gather moves the whole logits)."""
        return self.model.compute_greedy(_rows(hidden, rows))

    def _greedy_only(self, item: ScheduledRow) -> bool:
        """Whether the row's token is the argmax of its unedited logits and nothing else of them is
        reported: then, across tensor-parallel ranks, ``compute_greedy`` is all it needs."""
        params = item.seq.sampling_params
        return (params.greedy and params.logprobs is None and params.guided_decoding is None
                and not (params.needs_penalties or params.logit_bias or params.min_tokens
                         or item.seq.bad_words_token_ids or item.draft_token_ids))

    def _queue_logits(self, hidden: torch.Tensor, inputs: ModelInputs,
                      results: dict[int, SequenceResult]) -> QueuedLogits:
        queued = QueuedLogits(results)
        row_index: list[int] = []
        owners, row_drafts = queued.owners, queued.row_drafts
        for item, offset in zip(inputs.order, inputs.token_offsets):
            if not item.samples:
                continue
            seq, drafts = item.seq, item.draft_token_ids
            first = offset + item.num_new_tokens - len(drafts) - 1
            owners.append((item, len(row_index)))
            if not drafts:
                row_drafts.append((seq, drafts))
                row_index.append(first)
                continue
            for j in range(len(drafts) + 1):
                row_drafts.append((seq, drafts[:j]))
                row_index.append(first + j)
        if row_index:
            first, count = row_index[0], len(row_index)
            # ascending, so contiguous when the ends are (decodes): a view, and a small message to workers
            rows = slice(first, first + count) if row_index[-1] - first == count - 1 else row_index
            if self.greedy_over_shards and all(self._greedy_only(item) for item, _ in owners):
                queued.greedy = self.compute_greedy(hidden, rows)
            else:
                queued.logits = self.compute_logits(hidden, rows)
        return queued

    @torch.inference_mode()
    def sample_tokens(self, grammar: Optional[GrammarMask] = None) -> PendingStep:
        """Sample the step ``execute_model`` queued; its ``results()`` are the new tokens (and
        logprobs) keyed by ``seq_id``. ``grammar`` masks the guided sequences' rows."""
        queued, self.queued = self.queued, None
        owners = queued.owners
        if queued.greedy is not None:
            if grammar is not None:
                raise RuntimeError("a guided row's step skipped its logits (ModelRunner._greedy_only)")
            for item, _ in owners:
                item.seq.num_pending_tokens += 1
            tokens, chosen = queued.greedy
            return self._one_token_a_row(queued, tokens, chosen=chosen, top_k=[None] * tokens.shape[0])
        if queued.logits is None:
            return PendingStep(queued.results)
        # a row without drafts reads its sequence's own list: the sampling below is done before a
        # later read appends to it, and a copy a row a step would cost O(length) each time
        rows = [SamplingRow(seq, seq.output_token_ids + drafts if drafts else seq.output_token_ids)
                for seq, drafts in queued.row_drafts]
        batch = self.last_batch = SamplingBatch.build(rows, queued.logits.device, self.last_batch)
        dist = self.sampler.distribution(queued.logits, batch, grammar)
        top_k = [row.seq.sampling_params.logprobs for row in rows]
        for item, _ in owners:
            item.seq.num_pending_tokens += 1
        tokens = self.sampler.sample(dist, batch)
        if not any(item.num_draft_tokens for item, _ in owners):
            return self._one_token_a_row(queued, tokens, logits=dist.logits, logsumexp=dist.logsumexp, top_k=top_k)
        self.last_sampled = None
        num_accepted = verify_drafts(tokens, [DraftGroup(start, item.draft_token_ids) for item, start in owners])
        return PendingStep(queued.results, [SampledRows(item.seq, start, group)
                                            for group, (item, start) in enumerate(owners)],
                           tokens, dist.logits, dist.logsumexp, top_k, num_accepted)

    def _one_token_a_row(self, queued: QueuedLogits, tokens: torch.Tensor, **logprobs: Any) -> PendingStep:
        """A step without drafts; its tokens also feed the next step on the device (``last_sampled``).
        ``logprobs``: ``PendingStep``'s sources of the rows' logprobs."""
        owners = queued.owners
        self.last_sampled = SampledTokens(tokens, {item.seq.seq_id: start for item, start in owners})
        return PendingStep(queued.results, [SampledRows(item.seq, start) for item, start in owners], tokens,
                           **logprobs)

    def _prompt_logprobs(self, hidden: torch.Tensor, inputs: ModelInputs,
                         results: dict[int, SequenceResult]) -> None:
        """Logprob of each prompt token given the ones before it, for requests that asked."""
        for item, offset in zip(inputs.order, inputs.token_offsets):
            seq, k = item.seq, item.seq.sampling_params.prompt_logprobs
            if k is None or seq.index != 0:
                continue
            start = seq.num_computed_tokens
            stop = min(start + item.num_new_tokens, seq.num_prompt_tokens - 1)
            if seq.num_prompt_logprobs > stop:
                continue  # recomputed after a preemption: every entry is reported already
            seq.num_prompt_logprobs = stop + 1
            entries: list[Optional[Logprobs]] = [None] if start == 0 else []
            for chunk in range(start, stop, PROMPT_LOGPROB_CHUNK):
                end = min(chunk + PROMPT_LOGPROB_CHUNK, stop)
                rows = slice(offset + chunk - start, offset + end - start)
                logprobs = self.compute_logits(hidden, rows).log_softmax(dim=-1)
                actual = torch.tensor(seq.prompt_token_ids[chunk + 1:end + 1], device=logprobs.device)
                actual_lp = logprobs.gather(-1, actual[:, None]).squeeze(-1).tolist()
                top_v, top_i = logprobs.topk(max(k, 1), dim=-1) if k else (None, None)
                for r, token in enumerate(actual.tolist()):
                    entry = dict(zip(top_i[r].tolist(), top_v[r].tolist())) if k else {}
                    entry[token] = actual_lp[r]
                    entries.append(entry)
            results[seq.seq_id].prompt_logprobs = entries
            results[seq.seq_id].prompt_logprobs_start = 0 if start == 0 else start + 1

    # ---- prefills outside serving ------------------------------------------------------------
    @torch.inference_mode()
    def profile_peak_bytes(self, num_tokens: int, max_model_len: int, max_num_seqs: int) -> int:
        """Run the largest prefill batch once, with a throw-away cache, and report peak memory."""
        lengths = [max_model_len] * (num_tokens // max_model_len)
        if num_tokens % max_model_len:
            lengths.append(num_tokens % max_model_len)
        hidden = self._throwaway_prefill(lengths)
        if is_last_stage():
            self.model.compute_logits(hidden[: max_num_seqs])
        self.platform.synchronize()
        return self.platform.peak_memory_bytes()

    @torch.inference_mode()
    def run_prompts(self, prompts: list[list[int]]) -> None:
        """Token-id prompts through the model as loaded (a quantizer's ``online_calibration``)."""
        self._throwaway_prefill([len(ids) for ids in prompts], [token for ids in prompts for token in ids])

    def _throwaway_prefill(self, lengths: list[int], token_ids: Optional[list[int]] = None) -> torch.Tensor:
        """Hidden states of prompts of ``lengths``, run in a cache of their own: the serving cache,
        if there is one yet, is left as it was."""
        serving = self.kv_caches, self.num_blocks
        self._allocate_caches(sum(-(-n // self.block_size) for n in lengths) + 1)
        try:
            inputs = self._dummy_inputs([(n, n) for n in lengths], token_ids)
            return self._eager_forward(inputs.input_ids, inputs.positions, inputs.attn_metadata)
        finally:
            self.kv_caches, self.num_blocks = serving
