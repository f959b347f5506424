"""The engine loop: add requests, ``step()`` them through scheduler and runner, emit outputs."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from fastllm import registry
from fastllm.adapters import LoRARequest
from fastllm.config import EngineConfig
from fastllm.distributed.parallel_state import experts_over_replicas
from fastllm.engine.grammars import GrammarMasks, advance_grammars
from fastllm.engine.input_processor import InputProcessor, RequestError
from fastllm.engine.kv_cache_manager import KVCacheManager
from fastllm.engine.output_processor import OutputKind, OutputProcessor, RequestDelta
from fastllm.engine.request_state import RequestState, SampleState
from fastllm.engine.scheduler import Schedule, ScheduledSequence, Scheduler
from fastllm.engine.stats import EngineStats
from fastllm.engine.sequence import Sequence
from fastllm.executor import create_executor
from fastllm.model_loader.resolve import load_tokenizer, resolve_load_format
from fastllm.models.interface import promote_text_config
from fastllm.multimodal.inputs import MultimodalInputs
from fastllm.multimodal.media import load_media
from fastllm.outputs import CompletionOutput, RequestMetrics, RequestOutput
from fastllm.sampling_params import GuidedDecodingParams, SamplingParams
from fastllm.spec_decode.drafts import DraftRoom
from fastllm.structured_output.drafts import clip_drafts
from fastllm.worker.gc_heap import freeze_startup_heap, pace_full_collections, thaw_heap
from fastllm.worker.pending_step import PendingStep

logger = logging.getLogger("fastllm")

# Tokens appended to their sequences but not yet detokenized: (request, sample, token).
TextToDecode = list[tuple[RequestState, SampleState, int]]


@dataclass
class InFlightStep:
    """A launched step whose tokens the engine has not read yet.

    ``overlapped``: its counts advanced at launch and its tokens are pending on the device, so
    the next step may launch before it is read. A step that verifies drafts never is: how many
    drafts it accepts decides the next step's positions, so it is read before the next launch.
    """

    scheduled: list[ScheduledSequence]
    sampling: list[Sequence]  # the sequences that get a token from it
    pending: PendingStep
    launch_time: float
    overlapped: bool


def select_platform(name: Optional[str]) -> Any:
    """The platform named, else the available one of highest priority (a third-party platform
    plugin outranks the CPU by declaring a higher ``priority``)."""
    if name:
        return registry.get("platforms", name)()
    available = [entry.factory for entry in registry.entries("platforms").values() if entry.factory.is_available()]
    return max(available, key=lambda factory: factory.priority)()


def load_model_files(config: EngineConfig) -> tuple[str, Any, Any, Any]:
    """The model's load format, its loader, its HF config (with ``hf_overrides``) and its tokenizer."""
    load_format = resolve_load_format(config.model, config.load_format)
    loader = registry.get("load_formats", load_format)()
    hf_config = loader.load_config(config.model)
    for key, value in config.hf_overrides.items():
        setattr(hf_config, key, value)
    promote_text_config(hf_config)
    return load_format, loader, hf_config, load_tokenizer(loader, config.model, config.tokenizer)


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.platform = select_platform(config.platform)
        self.load_format, loader, self.hf_config, self.tokenizer = load_model_files(config)
        self.multimodal = self._multimodal_processor()
        model_len = getattr(self.hf_config, "max_position_embeddings", None) or 2048
        if config.max_model_len and config.max_model_len > model_len:
            raise ValueError(f"max_model_len={config.max_model_len} exceeds the model's "
                             f"max_position_embeddings={model_len}")
        self.max_model_len = config.max_model_len or model_len
        self.max_num_batched_tokens = config.max_num_batched_tokens or max(
            min(self.max_model_len, 8192), config.max_num_seqs)
        # the runners size step buffers by it (copy-engine sums)
        config = self.config = config.model_copy(update={"max_num_batched_tokens": self.max_num_batched_tokens})
        checkpoint_dtype = getattr(self.hf_config, "torch_dtype", None) or getattr(self.hf_config, "dtype", None)
        if isinstance(checkpoint_dtype, str):
            checkpoint_dtype = getattr(torch, checkpoint_dtype, None)
        self.dtype = self.platform.resolve_dtype(config.dtype, checkpoint_dtype)
        self.structured_output = self._structured_output_backend()
        self.runner = create_executor(config, self.hf_config, self.platform, loader, self.dtype)
        num_blocks = self._num_kv_blocks()
        self.runner.allocate_kv_cache(num_blocks, self.max_num_batched_tokens)
        logger.info("Doing profile, the total_block_num:%d (block_size %d, %d tokens)",
                    num_blocks, config.block_size, num_blocks * config.block_size)
        self.kv_cache = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self._fit_model_len_to_cache()
        self.scheduler = Scheduler(self.kv_cache, config.max_num_seqs, self.max_num_batched_tokens,
                                   config.enable_chunked_prefill, config.kv_cache_ratio,
                                   config.max_loras if config.enable_lora else None)
        self.eos_token_ids = self._eos_token_ids()
        self.inputs = InputProcessor(self.tokenizer, self.max_model_len, self.hf_config.vocab_size)
        self.speculator = self._speculative_decoder()
        self.drafts = DraftRoom(self.max_model_len)
        # a data-parallel replica whose MoE layers meet the other replicas' every step runs one
        # forward pass a step, an idle one if nothing is scheduled
        self.lockstep = experts_over_replicas()
        self.overlap = self._overlap_steps()
        self.in_flight: Optional[InFlightStep] = None
        self.requests: dict[str, RequestState] = {}
        self.num_draft_tokens = self.num_accepted_tokens = 0  # over every request, for stats()
        reasoning_parser_cls = (registry.get("reasoning_parsers", config.reasoning_parser)
                                if config.reasoning_parser else None)
        self.output_processor = OutputProcessor(self.tokenizer, reasoning_parser_cls)
        freeze_startup_heap()

    # ---- construction helpers ------------------------------------------------------------------
    def _num_kv_blocks(self) -> int:
        if self.config.num_gpu_blocks_override:
            return self.config.num_gpu_blocks_override + 1
        budget = self.platform.kv_cache_budget(
            lambda: self.runner.profile_peak_bytes(self.max_num_batched_tokens, self.max_model_len,
                                                   self.config.max_num_seqs),
            self.config)
        num_blocks = budget // self.runner.bytes_per_block()
        if num_blocks < 2:
            raise ValueError("no memory is left for the KV cache; lower max_num_batched_tokens or "
                             "raise gpu_memory_utilization / cpu_kv_cache_gib")
        return int(num_blocks)

    def _fit_model_len_to_cache(self) -> None:
        """A sequence longer than the whole cache could never be scheduled: cap the length instead."""
        capacity = self.kv_cache.pool.num_usable_blocks * self.config.block_size
        if capacity < self.max_model_len:
            logger.warning("the KV cache holds %d tokens, fewer than max_model_len=%d: capping "
                           "max_model_len to %d", capacity, self.max_model_len, capacity)
            self.max_model_len = capacity

    def _eos_token_ids(self) -> frozenset[int]:
        ids = getattr(self.hf_config, "eos_token_id", None)
        ids = set(ids if isinstance(ids, (list, tuple)) else [ids] if ids is not None else [])
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return frozenset(ids)

    def _structured_output_backend(self) -> Any:
        """An unknown name fails here, at start-up, with the registered names listed."""
        factory = registry.get("structured_output_backends", self.config.structured_output_backend)
        return factory(self.tokenizer, self.hf_config.vocab_size) if self.tokenizer is not None else None

    def _multimodal_processor(self) -> Any:
        """The architecture's image/video processor plugin, or None for a text-only model."""
        entry = registry.entries("multimodal_processors").get((self.hf_config.architectures or [""])[0])
        return entry.factory(self.hf_config, self.tokenizer, self.config.model) if entry else None

    def _speculative_decoder(self) -> Any:
        spec = self.config.speculative_config
        if not spec:
            return None
        return registry.get("speculative_decoders", spec.get("method", ""))(spec, self.config)

    def _overlap_steps(self) -> bool:
        """Async scheduling: on where launches return early (CUDA), unless configured.

        A speculative decoder keeps it: steps without drafts overlap as in plain decoding, and
        only a step in which some sequence wants drafts runs on its own (see ``step``). Lockstep
        replicas keep it too: every step still runs exactly one forward pass (an idle one if nothing
        is scheduled), so the replicas' collectives pair up."""
        wanted = self.config.async_scheduling
        return self.runner.overlaps_steps if wanted is None else wanted

    # ---- requests ------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: Optional[str], prompt_token_ids: Optional[list[int]],
                    params: SamplingParams, arrival_time: Optional[float] = None,
                    chat_template_kwargs: Optional[dict[str, Any]] = None,
                    output_kind: OutputKind = OutputKind.CUMULATIVE,
                    lora_request: Optional[LoRARequest] = None,
                    multimodal_data: Optional[dict[str, Any]] = None, tool_call_parser: Optional[str] = None,
                    multimodal: Optional[MultimodalInputs] = None, grammar: Any = None) -> None:
        """Queue a request; raises RequestError (and queues nothing) when the input is bad.
        ``multimodal_data``: images and videos (``{"image": [...], "video": [...]}``) for the
        placeholder tokens of the prompt, in order; or ``multimodal``, what ``process_media``
        made of them, with the expanded ``prompt_token_ids``.
        ``output_kind``: what ``step()`` returns for it (``fastllm.engine.output_processor``): its
        output after every step that advanced it (streaming), only once it finishes (offline
        generation), or each step's delta (the engine-core process). ``grammar``: the
        request's guided-decoding spec as ``compile_grammar`` returned it, compiled beforehand.
        ``tool_call_parser``: the ``tool_parsers`` entry that splits tool calls from its text."""
        if request_id in self.requests:
            raise RequestError(f"request id {request_id!r} is already in use")
        # the caller's ids unless tokenized or media-expanded here: its deltas need not send them back
        caller_has_ids = prompt_token_ids is not None and not multimodal_data and multimodal is None
        if prompt_token_ids is None:
            prompt_token_ids = self.inputs.tokenize(prompt)
        if multimodal_data:
            prompt_token_ids, multimodal = self.process_media(prompt_token_ids, multimodal_data)
        self.inputs.validate(prompt_token_ids, params)
        adapter_id, cache_salt = self._adapter_of(lora_request)
        bad_words = self.inputs.bad_words_token_ids(params) if params.bad_words else []
        compiled = grammar
        if params.guided_decoding is not None and compiled is None:
            compiled = self.compile_grammar(params.guided_decoding)
        thinking = (chat_template_kwargs or {}).get("enable_thinking", True)
        seqs = []
        for index in range(params.n):
            seq = Sequence(request_id, index, list(prompt_token_ids), params, self.eos_token_ids,
                           self.max_model_len, bad_words_token_ids=bad_words, adapter_id=adapter_id,
                           cache_salt=cache_salt, multimodal=multimodal)
            if params.seed is not None:
                seq.seed = params.seed + index
            if compiled is not None:
                seq.structured_state = self.structured_output.new_matcher(compiled)
            seqs.append(seq)
        self.requests[request_id] = self.output_processor.new_request(
            request_id, prompt, seqs, arrival_time or time.time(), thinking, output_kind, tool_call_parser,
            caller_has_ids)
        for seq in seqs:
            if self.speculator is not None:
                self.speculator.on_prompt(seq)
            self.scheduler.add(seq)

    def add_adapter(self, lora_request: LoRARequest) -> None:
        """Check and load an adapter ahead of its requests; RequestError when it cannot be served."""
        self._adapter_of(lora_request)

    def remove_adapter(self, adapter_id: int) -> bool:
        """Forget an adapter no request is using; False when it was not loaded."""
        if not self.config.enable_lora:
            return False
        if any(seq.adapter_id == adapter_id for seq in [*self.scheduler.running, *self.scheduler.waiting]):
            raise RequestError(f"LoRA adapter {adapter_id} still has requests in flight")
        return self.runner.adapters.remove(adapter_id)

    def _adapter_of(self, lora_request: Optional[LoRARequest]) -> tuple[int, bytes]:
        """The adapter id and prefix-cache salt of a request; the adapter is checked and loaded."""
        if lora_request is None:
            return 0, b""
        if not self.config.enable_lora:
            raise RequestError("this engine serves no adapters: start it with enable_lora=True")
        self.runner.adapters.add(lora_request)
        return lora_request.lora_int_id, lora_request.cache_salt

    def process_media(self, prompt_token_ids: list[int], data: dict[str, Any]) -> tuple[list[int], MultimodalInputs]:
        """The prompt with its placeholders expanded, and its multimodal inputs. It reads only
        the configuration, so the server runs it off the engine's thread (decoding and
        resizing images takes milliseconds each)."""
        if self.multimodal is None:
            raise RequestError(f"{self.hf_config.architectures[0]} takes no images or video")
        media = load_media(data, self.config.limit_mm_per_prompt, self.config.allowed_local_media_path)
        try:
            return self.multimodal.process(list(prompt_token_ids), media)
        except RequestError:
            raise
        except ValueError as exc:  # the HF processor's own refusals (RequestError is one too)
            raise RequestError(f"cannot process the media: {exc}") from exc

    def compile_grammar(self, spec: GuidedDecodingParams) -> Any:
        """The structured-output backend's grammar for ``spec`` (strict as configured unless the
        request says); raises RequestError, naming what and where, for one it refuses. Safe to
        call off the engine thread: the backends compile concurrently with masking."""
        if self.structured_output is None:
            raise RequestError("guided decoding needs a structured-output backend plugin and a tokenizer")
        if spec.strict is None:
            spec = spec.model_copy(update={"strict": self.config.structured_output_strict})
        try:
            return self.structured_output.compile(spec)
        except ValueError as exc:
            raise RequestError(f"invalid guided decoding spec: {exc}") from exc

    def abort_request(self, request_id: str) -> Optional[RequestOutput | RequestDelta]:
        """The aborted request's last output, in its ``OutputKind`` (final-only gets its output)."""
        state = self.requests.pop(request_id, None)
        if state is None:
            return None
        self.output_processor.abort(state)
        for sample in state.samples:
            self._release(sample.seq)
        return self.output_processor.emit(state)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def start_profile(self) -> None:
        """Record every rank's work from now until ``stop_profile`` into ``FASTLLM_TORCH_PROFILER_DIR``
        (``fastllm.platforms.step_profiler``)."""
        self.runner.profile(True)

    def stop_profile(self) -> None:
        self.runner.profile(False)

    def shutdown(self) -> None:
        """Stop the runner's workers, if any, and let the collector reclaim the engine once dropped."""
        self.runner.shutdown()
        thaw_heap()

    def stats(self) -> EngineStats:
        """The scheduler's, the KV cache's and the speculator's counts, for metrics."""
        scheduler, kv_cache = self.scheduler, self.kv_cache
        return EngineStats(
            num_requests_running=len({seq.request_id for seq in scheduler.running}),
            num_requests_waiting=len({seq.request_id for seq in scheduler.waiting}),
            kv_cache_usage=kv_cache.usage(), num_free_blocks=kv_cache.num_free_blocks,
            num_usable_blocks=kv_cache.pool.num_usable_blocks, num_preemptions=scheduler.num_preemptions,
            spec_num_draft_tokens=self.num_draft_tokens, spec_num_accepted_tokens=self.num_accepted_tokens,
            num_running_adapters=len({seq.adapter_id for seq in scheduler.running} - {0}))

    def _release(self, seq: Sequence) -> None:
        self.scheduler.finish(seq)
        if self.speculator is not None:
            self.speculator.on_finished(seq)

    # ---- the loop ------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput | RequestDelta]:
        """Run one scheduled batch; return the output of every request that advanced, in its ``OutputKind``.

        With ``overlap`` the batch is queued on the device before the tokens of the batch
        before it are read, so the host's work (reading tokens, stop checks, detokenizing,
        scheduling, packing inputs) runs while the device computes; outputs then trail the
        launch by one call. A sequence whose next logits need its latest token on the host (a
        grammar, penalties) does not stop the overlap: the batch's forward pass is queued
        first, the step in flight is read while it runs, and only then are the batch's
        sampling rows built and its grammar masks filled; the read tokens are detokenized
        (and checked for stop strings) after the sampling is queued, off that critical path.

        With a speculative decoder, a step in which no sequence wants drafts overlaps just the
        same. When one does, the step in flight is read first (drafts continue each sequence's
        latest token), then drafts are proposed and the step is launched and read before this
        returns: its accepted counts decide where the next step starts, and that one may
        overlap again.
        """
        touched: dict[str, RequestState] = {}
        if self.speculator is not None and self.drafts.wanted(self.speculator, self.scheduler.running):
            if self.in_flight is not None:
                touched.update(self._read(self.in_flight))
                self.in_flight = None
            self.drafts.propose(self.speculator, self.scheduler.running)
            clip_drafts(self.structured_output, self.scheduler.running, self.eos_token_ids)
        previous, self.in_flight = self.in_flight, None
        out = self.scheduler.schedule()
        if not out.scheduled:
            if previous is not None:
                touched.update(self._read(previous))
            if self.lockstep:
                self.runner.idle_step()
        elif not self.overlap or any(item.num_draft_tokens for item in out.scheduled):
            touched.update(self._read(self._launch(out, overlapped=False)))
        elif previous is not None and self._samples_need_previous(out.scheduled):
            deferred: TextToDecode = []
            self.in_flight = self._launch(out, overlapped=True,
                                          read_between=lambda: touched.update(self._read(previous, deferred)))
            self._detokenize(deferred)
        else:
            self.in_flight = self._launch(out, overlapped=True)
            if previous is not None:
                touched.update(self._read(previous))
        outputs = [output for output in map(self._emit, touched.values()) if output is not None]
        pace_full_collections(bool(self.requests))  # a paced collection while the device runs the step queued
        return outputs

    @staticmethod
    def _samples_need_previous(scheduled: list[ScheduledSequence]) -> bool:
        """Whether a sequence samples from logits that depend on its token still in flight."""
        return any(item.seq.num_pending_tokens and item.seq.needs_host_tokens for item in scheduled)

    def _launch(self, schedule: Schedule, overlapped: bool,
                read_between: Optional[Callable[[], None]] = None) -> InFlightStep:
        """Run the step on the runner: its forward pass, ``read_between`` (the engine reads the
        step before there, while the device computes this one's logits), then its sampling."""
        scheduled = schedule.scheduled
        now = time.time()
        for item in scheduled:
            if item.seq.output_token_ids:  # it has generated: its request's times are set
                continue
            metrics = self.requests[item.seq.request_id].metrics
            if metrics.inference_start_time is None:
                metrics.inference_start_time = now
                metrics.time_in_queue = now - metrics.arrival_time
        sampling = [item.seq for item in scheduled if item.samples]
        reading = 0.0
        start = time.perf_counter()
        self.runner.execute_model(schedule.output)
        if read_between is not None:
            begin = time.perf_counter()
            read_between()
            reading = time.perf_counter() - begin
        pending = self.runner.sample_tokens(self._grammar(sampling, schedule.output.draft_token_ids))
        step = InFlightStep(scheduled, sampling, pending, time.perf_counter() - start - reading, overlapped)
        if overlapped:  # no drafts to verify: the counts advance now, the tokens stay pending
            self.scheduler.update(scheduled)
            for seq in sampling:
                seq.num_pending_tokens += 1
        return step

    def _grammar(self, sampling: list[Sequence], drafts: dict[int, list[int]]) -> Optional[GrammarMasks]:
        """The masks of the step's live guided sequences, after the ``drafts`` each verifies (the
        runner's view's); a sequence that a token read after its step was queued finished
        samples a discarded token: its grammar may be complete, so it is not masked."""
        guided = {seq.seq_id: seq.structured_state for seq in sampling
                  if seq.structured_state is not None and not seq.is_finished}
        return GrammarMasks(self.structured_output, guided, drafts) if guided else None

    def _read(self, step: InFlightStep, deferred: Optional[TextToDecode] = None) -> dict[str, RequestState]:
        """Read a launched step's tokens and hand them to their requests; return those requests.
        With ``deferred``, tokens are appended but left there to detokenize (``_detokenize``)."""
        start = time.perf_counter()
        results = step.pending.results()
        forward_time = step.launch_time + time.perf_counter() - start
        if step.overlapped:
            for seq in step.sampling:
                seq.num_pending_tokens -= 1
        else:
            for item in step.scheduled:
                item.num_accepted_drafts = results[item.seq.seq_id].num_accepted_drafts
            self.scheduler.update(step.scheduled)
        advance_grammars(self.structured_output, step.scheduled, results)
        touched: dict[str, RequestState] = {}
        for item in step.scheduled:
            seq, result = item.seq, results[item.seq.seq_id]
            if seq.is_finished:  # finished or aborted by an earlier step while this one ran
                continue
            state = self.requests[seq.request_id]
            state.metrics.model_forward_time += forward_time
            touched[seq.request_id] = state
            if result.prompt_logprobs:  # a chunk recomputed after a preemption adds only what is new
                known = len(seq.prompt_logprobs) - result.prompt_logprobs_start
                seq.prompt_logprobs.extend(result.prompt_logprobs[max(known, 0):])
            self._append_tokens(state, item, result, deferred)
        return touched

    def _append_tokens(self, state: RequestState, item, result, deferred: Optional[TextToDecode] = None) -> None:
        seq = item.seq
        sample = state.samples[seq.index]
        if seq.draft_token_ids:
            seq.draft_token_ids = []
        tokens = result.new_token_ids
        last = len(tokens) - 1
        keep_logprobs = seq.sampling_params.logprobs is not None
        check_token, detokenize = self.output_processor.check_token, self.output_processor.detokenize
        for i, token in enumerate(tokens):
            seq.append_token(token)
            seq.cumulative_logprob += result.token_logprobs[i]
            if keep_logprobs:
                seq.output_logprobs.append(result.logprobs[i])
            check_token(seq, result.grammar_terminated and i == last)
            if deferred is None:
                # token by token: a stop string ends at its own token
                detokenize(state, sample, [token])
            else:
                deferred.append((state, sample, token))
            if seq.is_finished:
                break
        if self.speculator is not None and result.new_token_ids:
            metrics = state.metrics
            metrics.num_draft_tokens += item.num_draft_tokens
            metrics.num_accepted_tokens += result.num_accepted_drafts
            metrics.num_spec_steps += item.num_draft_tokens > 0
            self.num_draft_tokens += item.num_draft_tokens
            self.num_accepted_tokens += result.num_accepted_drafts
            self.speculator.on_step(seq, item.num_draft_tokens, result.num_accepted_drafts)
        if seq.is_finished:
            self._release(seq)

    def _detokenize(self, deferred: TextToDecode) -> None:
        """Detokenize tokens that ``_read`` appended without; a stop string found now ends its
        sequence (a token sampled for it meanwhile is dropped when read, as after any finish)."""
        for state, sample, token in deferred:
            finished = sample.seq.is_finished
            self.output_processor.detokenize(state, sample, [token])
            if sample.seq.is_finished and not finished:
                self._release(sample.seq)

    def _emit(self, state: RequestState) -> Optional[RequestOutput | RequestDelta]:
        if state.finished:
            del self.requests[state.request_id]
        return self.output_processor.emit(state)

    # ---- errors --------------------------------------------------------------------------------
    @staticmethod
    def error_output(request_id: str, prompt: Optional[str], prompt_token_ids: Optional[list[int]],
                     error: RequestError) -> RequestOutput:
        """A finished output that carries a request's error instead of text."""
        completion = CompletionOutput(index=0, finish_reason="error")
        return RequestOutput(request_id=request_id, prompt=prompt, prompt_token_ids=prompt_token_ids or [],
                             outputs=completion, completions=[completion], finished=True,
                             metrics=RequestMetrics(arrival_time=time.time()),
                             error_code=error.code, error_msg=str(error))
