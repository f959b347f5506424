"""xgrammar's JSON-schema compiler warns of what it approximates on the process's stderr (C++
logging, not Python's): capture them while compiling and turn them into coverage gaps."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
from typing import Iterator

from fastllm.structured_output.coverage import Gap

_LOCK = threading.Lock()
# a warning's text -> the keyword it approximates; any other warning is named by its own text
_WARNED_KEYWORDS = {"oneOf with overlapping": "oneOf", "allOf with multiple": "allOf", "Anchor": "pattern"}


@contextlib.contextmanager
def converter_warnings() -> Iterator[list[Gap]]:
    """Collect the approximations xgrammar warns of inside the block. File descriptor 2 is
    redirected meanwhile; whatever else was written to it is written back afterwards."""
    gaps: list[Gap] = []
    with _LOCK, tempfile.TemporaryFile() as sink:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield gaps
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            other = []
            for line in sink.read().decode(errors="replace").splitlines(keepends=True):
                if "Warning: " not in line or ".cc:" not in line:
                    other.append(line)
                    continue
                warning = line.split("Warning: ", 1)[1].strip()
                keyword = next((k for text, k in _WARNED_KEYWORDS.items() if warning.startswith(text)), warning)
                if Gap(keyword, None, "approximated") not in gaps:
                    gaps.append(Gap(keyword, None, "approximated"))
            if other:
                os.write(2, "".join(other).encode())
