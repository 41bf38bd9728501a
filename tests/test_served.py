"""``GET /v1/models`` (ceiling.server.sync): doctor's target and the sanity checks report each
failure the same way, with the message and fix that say which failure it was."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from ceiling.errors import CeilingError, ExitStatus
from ceiling.flows.target import served_models as doctor_models
from ceiling.sanity.checks import _Server
from ceiling.server.schema import ServedModel
from ceiling.server.sync import served_models


class _Handler(http.server.BaseHTTPRequestHandler):
    status = 200
    body = b'{"data": [{"id": "tiny", "owned_by": "vllm", "root": "/m"}, {"object": "x"}]}'
    delay_s = 0.0

    def do_GET(self) -> None:
        time.sleep(self.delay_s)
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, type[_Handler]]]:
    handler = type("H", (_Handler,), {})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", handler
    srv.shutdown()
    srv.server_close()


def _both(url: str, timeout_s: float = 5.0) -> list[CeilingError]:
    """The error each caller raises: doctor's (via flows.target) and sanity's (_Server)."""
    errs = []
    for ask in (lambda: doctor_models(url), lambda: _Server(url, "", timeout_s).models()):
        with pytest.raises(CeilingError) as info:
            ask()
        errs.append(info.value)
    return errs


def test_the_entries_typed_and_a_nameless_one_left_out(server):
    url, _ = server
    want = [ServedModel(id="tiny", owned_by="vllm", root="/m")]
    assert doctor_models(url) == want
    assert _Server(url, "", 5.0).models() == want


@pytest.mark.parametrize("code", [401, 403])
def test_a_refused_key_says_it_needs_an_api_key(server, code):
    url, h = server
    h.status = code
    for e in _both(url):
        assert (
            e.message == f"{url}/v1/models refused the request (HTTP {code}): it needs an API key"
        )
        assert "CEILING_API_KEY" in (e.fix or "") and e.exit_code == ExitStatus.SERVER


def test_another_status_is_no_openai_api_at_that_url(server):
    url, h = server
    h.status = 404
    for e in _both(url):
        assert e.message == f"no OpenAI-compatible API at {url} (GET /v1/models: HTTP 404)"
        assert "server root" in (e.fix or "")


def test_an_answer_that_is_no_model_list(server):
    url, h = server
    h.body = b'{"models": []}'
    for e in _both(url):
        assert e.message == f"{url}/v1/models did not answer an OpenAI model list"


def test_no_server_and_a_timeout_say_start_it_naming_the_command_that_launches():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    doctor, sanity = _both(url)
    for e, command in ((doctor, "doctor"), (sanity, "ceiling")):
        assert e.message.startswith(f"no OpenAI-compatible server at {url}: ")
        assert e.fix == f"start the server, or pass --variant FILE to let {command} launch it"
        assert e.exit_code == ExitStatus.SERVER


def test_a_timeout_is_no_server(server):
    url, h = server
    h.delay_s = 1.0
    with pytest.raises(CeilingError, match=r"no OpenAI-compatible server at .*timed out"):
        served_models(url, timeout_s=0.2)
