"""Rendering chat templates as untrusted code: in a child process, under a memory, time and size cap.

A template is a program. Jinja's sandbox stops it from reaching Python internals, but not
from building a gigabyte string (``{{ 'A' * 10**9 }}``) or looping for minutes. So the
server renders every template (a request may bring its own) in a spawned child process
whose address space is capped (``RLIMIT_AS``: a runaway allocation is a MemoryError there,
never the kernel's OOM killer here), whose render is interrupted after ``timeout_s``
(``SIGALRM``; a child that does not answer in time is killed and replaced), and whose
output is refused beyond ``max_chars``. The child renders with transformers' own renderer
(an ``ImmutableSandboxedEnvironment``), so prompts are exactly what ``apply_chat_template``
would produce.
"""

from __future__ import annotations

import os
import pickle
import queue
import resource
import select
import signal
import subprocess
import sys
from typing import IO, Any, Mapping, Optional, Sequence

# what a child may allocate above what it holds after start-up (interpreter plus jinja and transformers)
MEMORY_BUDGET_BYTES = 512 << 20
STARTUP_GRACE_S = 30.0  # a fresh child imports transformers before its first answer


class TemplateLimitError(ValueError):
    """A template broke a limit (memory, time, size): the request's 400."""


def _send(stream: IO[bytes], message: Any) -> None:
    data = pickle.dumps(message)
    stream.write(len(data).to_bytes(8, "little") + data)
    stream.flush()


def _receive(stream: IO[bytes]) -> Any:
    header = stream.read(8)
    if len(header) < 8:
        raise EOFError
    return pickle.loads(stream.read(int.from_bytes(header, "little")))


def _render(source: str, messages: list, tools: Optional[list], variables: dict, max_chars: int,
            timeout_s: float) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        rendered, _ = render_jinja_template([messages], tools=tools, chat_template=source, **variables)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if len(rendered[0]) > max_chars:
        raise TemplateLimitError(f"the rendered prompt has more than {max_chars} characters, more than "
                                 "max_model_len tokens can hold")
    return rendered[0]


def _serve(requests: IO[bytes], answers: IO[bytes], memory_budget: int) -> None:
    """The child's loop: one render job in, one ``(ok, prompt or error message)`` out."""
    import transformers.utils.chat_template_utils  # noqa: F401  (imported before the cap is set)

    with open("/proc/self/statm") as statm:
        held = int(statm.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (held + memory_budget, held + memory_budget))

    def out_of_time(signum: int, frame: Any) -> None:
        raise TemplateLimitError("rendering the chat template took too long")

    signal.signal(signal.SIGALRM, out_of_time)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when this process ends
    while True:
        try:
            job = _receive(requests)
        except EOFError:
            return
        try:
            answer = (True, _render(*job))
        except MemoryError:
            answer = (False, "rendering the chat template needs too much memory")
        except TemplateLimitError as exc:
            answer = (False, str(exc))
        except Exception as exc:  # a template error: its type and first line only
            first_line = str(exc).splitlines()[0][:200] if str(exc) else ""
            answer = (False, f"{type(exc).__name__}: {first_line}")
        del job
        _send(answers, answer)


class _Child:
    """One sandbox process, started as a plain script (``-P``: nothing of fastllm is imported there)."""

    def __init__(self, memory_budget: int):
        self.process = subprocess.Popen([sys.executable, "-P", os.path.abspath(__file__), str(memory_budget)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.fresh = True

    def ask(self, job: tuple, timeout_s: float) -> tuple[bool, str]:
        _send(self.process.stdin, job)
        wait = timeout_s + (STARTUP_GRACE_S if self.fresh else 1.0)
        if not select.select([self.process.stdout], [], [], wait)[0]:
            raise TimeoutError
        self.fresh = False
        return _receive(self.process.stdout)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            stream.close()


class TemplateRenderer:
    """Renders on ``num_children`` child processes; ``render`` blocks, so call it off the event loop.

    Children start on first use and are reused; one that ran out of time or died is replaced.
    """

    def __init__(self, max_chars: int, timeout_s: float = 2.0, num_children: int = 2,
                 memory_budget: int = MEMORY_BUDGET_BYTES):
        self.max_chars, self.timeout_s, self.memory_budget = max_chars, timeout_s, memory_budget
        self._idle: queue.Queue[Optional[_Child]] = queue.Queue()
        for _ in range(num_children):
            self._idle.put(None)

    def render(self, source: str, messages: Sequence[Mapping[str, Any]], tools: Optional[list[dict]],
               variables: Mapping[str, Any]) -> str:
        """``variables`` are the template's globals besides ``messages`` and ``tools`` (special
        tokens, ``add_generation_prompt``, the request's ``chat_template_kwargs``)."""
        child = self._idle.get()
        try:
            if child is None or child.process.poll() is not None:
                child = _Child(self.memory_budget)
            job = (source, list(messages), tools, dict(variables), self.max_chars, self.timeout_s)
            try:
                ok, value = child.ask(job, self.timeout_s)
            except (TimeoutError, EOFError, OSError):  # stuck, or died (killed for memory, say): replace it
                child.kill()
                child = None
                raise TemplateLimitError("rendering the chat template failed in its sandbox (time or memory)") \
                    from None
        finally:
            self._idle.put(child)
        if not ok:
            raise TemplateLimitError(value)
        return value

    def close(self) -> None:
        for _ in range(self._idle.qsize()):
            child = self._idle.get_nowait()
            if child is not None:
                child.kill()


if __name__ == "__main__":
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray print in the child must not corrupt the answers
    _serve(sys.stdin.buffer, answers, int(sys.argv[1]))
