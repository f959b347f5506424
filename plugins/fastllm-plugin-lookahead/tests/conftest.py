"""One torch thread for the plugin's tests: its engines run tiny matrices, where a second
thread only adds synchronisation (and stalls badly on a busy machine)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
