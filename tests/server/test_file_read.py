"""No request reads a file: a marker file's content never shows in a response or in the log,
whatever form of its path a request uses and wherever in the request it puts it."""

from __future__ import annotations

import logging
import os
import uuid

import pytest

from tests.server.conftest import MODEL, start_server


@pytest.fixture(scope="module")
def logging_server(engine):
    running = start_server(engine, disable_log_requests=False)
    yield running
    running.stop()


def path_forms(path: str) -> list[str]:
    relative = os.path.relpath(path)
    return [path, f"file://{path}", relative, "./" + relative, "../" * 12 + path.lstrip("/"),
            f"/proc/self/root{path}", f"/proc/self/cwd/{relative}", os.path.dirname(path) + "//" +
            os.path.basename(path), "/proc/self/environ", "/proc/self/cmdline", "/etc/passwd"]


def test_a_marker_file_never_leaks(logging_server, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    marker = f"MARKER-{uuid.uuid4().hex}"
    path = str(tmp_path / "secret.jinja")
    with open(path, "w") as f:
        f.write(marker + "{{ messages[0].content }}")
    os.environ["FASTLLM_TEST_MARKER"] = marker  # what /proc/self/environ would show
    try:
        responses = []
        for form in path_forms(path):
            message = [{"role": "user", "content": form}]
            bodies = [("/v1/chat/completions", {"messages": message, "chat_template": form}),
                      ("/v1/chat/completions", {"messages": message,
                                                "chat_template": f"{{% include '{form}' %}}"}),
                      ("/v1/chat/completions", {"messages": message, "chat_template": "{{ messages[0].content }}",
                                                "chat_template_kwargs": {"path": form}}),
                      ("/v1/completions", {"prompt": form}),
                      ("/v1/completions", {"prompt": "hi", "model": form}),
                      ("/v1/completions", {"prompt": "hi", "guided_json": {"$ref": f"file://{form}"}})]
            for route, body in bodies:
                response = logging_server.post(route, json={"model": MODEL, "max_tokens": 1, **body})
                assert response.status_code < 500, response.text
                responses.append(response.text)
        responses.append(logging_server.get("/v1/models").text)
    finally:
        del os.environ["FASTLLM_TEST_MARKER"]
    assert not [text for text in responses if marker in text]
    assert marker not in caplog.text
    assert "Received request" in caplog.text  # the log was on, and it carries no prompt text
