"""What a request returns: the structures of FastDeploy's offline API (RequestOutput & co)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

# token_id -> logprob for one position; the sampled (or actual prompt) token is always included.
Logprobs = dict[int, float]


@dataclass
class RequestMetrics:
    """Wall-clock timestamps (time.time()) and durations in seconds of one request, and its
    speculative-decoding counts."""

    arrival_time: float
    inference_start_time: Optional[float] = None
    first_token_time: Optional[float] = None
    time_in_queue: Optional[float] = None
    model_forward_time: float = 0.0
    model_execute_time: float = 0.0
    finished_time: Optional[float] = None
    # Speculative decoding: drafts verified, drafts accepted, and the steps that verified any.
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_spec_steps: int = 0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per verification step: its accepted drafts plus the one every step yields."""
        return 1.0 + self.num_accepted_tokens / self.num_spec_steps if self.num_spec_steps else 1.0


@dataclass
class CompletionOutput:
    """One generated sequence; ``index`` tells which of the request's n samples it is.

    For a request that names a tool parser (``LLM.chat`` with tools, the server's ``auto`` tool
    choice), ``tool_calls`` holds the calls found so far (``fastllm.chat.ToolCall``, arguments
    as JSON text) and ``text`` only what is not a call; else ``tool_calls`` is None.
    """

    index: int
    send_idx: int = 0
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    reasoning_content: str = ""
    cumulative_logprob: float = 0.0
    logprobs: Optional[list[Logprobs]] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[int | str] = None
    tool_calls: Optional[list] = None


@dataclass
class RequestOutput:
    """The result of one prompt.

    ``outputs`` is the first (or only) completion, as in FastDeploy's API; with
    ``n > 1`` every sample is in ``completions``.
    """

    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    outputs: CompletionOutput
    completions: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    num_cached_tokens: int = 0
    prompt_logprobs: Optional[list[Optional[Logprobs]]] = None
    error_code: int = 200
    error_msg: str = ""
