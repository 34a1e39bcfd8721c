"""A local stand-in for the Hugging Face hub: the few endpoints `hf_hub_download` calls (HEAD and GET on
/{repo}/resolve/{revision}/{file}, with X-Repo-Commit, ETag and Range), plus plain files under /files/ for URL
sources. Started inside a test; nothing leaves the machine."""

from __future__ import annotations

import hashlib
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")


@dataclass
class FakeHub:
    files: dict[tuple[str, str], bytes] = field(default_factory=dict)  # (repo, file) -> content
    plain: dict[str, bytes] = field(default_factory=dict)  # /files/<name> -> content
    revisions: tuple[str, ...] = ("main", COMMIT)
    drop_after: dict[str, int] = field(default_factory=dict)  # path -> bytes sent before the first GET breaks off
    drop_every: dict[str, int] = field(default_factory=dict)  # path -> bytes sent before every GET breaks off
    log: list[tuple[str, str, str | None]] = field(default_factory=list)  # (method, path, Range header)
    etags: dict[tuple[str, str], str] = field(default_factory=dict)  # (repo, file) -> the sha256 the hub claims
    no_length: set[str] = field(default_factory=set)  # paths whose GETs send no Content-Length (close ends them)
    hold: dict[str, float] = field(default_factory=dict)  # path -> seconds a GET waits for a second GET of it
    url: str = ""
    _arrived: threading.Condition = field(default_factory=threading.Condition)
    _gets: dict[str, int] = field(default_factory=dict)

    def add(self, repo: str, file: str, content: bytes) -> str:
        self.files[(repo, file)] = content
        return hashlib.sha256(content).hexdigest()

    def gets(self, needle: str) -> list[str | None]:
        """The Range headers of the GETs whose path contains `needle` (None for a request without one)."""
        return [r for m, p, r in self.log if m == "GET" and needle in p]


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

        def _lookup(self) -> tuple[bytes | None, dict[str, str], int]:
            path = self.path.split("?", 1)[0]
            if path.startswith("/files/"):  # a static file server: validators, ranges
                body = hub.plain.get(path[len("/files/"):])
                if body is None:
                    return None, {}, 404
                etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
                return body, {"ETag": etag, "Last-Modified": "Tue, 01 Dec 2026 00:00:00 GMT",
                              "Accept-Ranges": "bytes"}, 200
            m = _RESOLVE.match(path)
            if m is None:
                return None, {}, 404
            repo, rev, file = m["repo"], m["rev"], m["file"]
            if not any(r == repo for r, _ in hub.files):
                return None, {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"}, 404
            if rev not in hub.revisions:
                return None, {"X-Error-Code": "RevisionNotFound", "X-Error-Message": "Invalid rev id"}, 404
            body = hub.files.get((repo, file))
            if body is None:
                return None, {"X-Error-Code": "EntryNotFound", "X-Error-Message": "Entry not found",
                              "X-Repo-Commit": COMMIT}, 404
            sha = hub.etags.get((repo, file)) or hashlib.sha256(body).hexdigest()
            return body, {"X-Repo-Commit": COMMIT, "ETag": f'"{sha}"', "X-Linked-Etag": f'"{sha}"',
                          "X-Linked-Size": str(len(body)), "Accept-Ranges": "bytes"}, 200

        def _answer(self, send_body: bool) -> None:
            rng = self.headers.get("Range")
            hub.log.append((self.command, self.path, rng))
            body, headers, status = self._lookup()
            if body is None:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start = 0
            if_range = self.headers.get("If-Range")
            if rng is not None and send_body and if_range in (None, headers.get("ETag"), headers.get("Last-Modified")):
                start = int(re.fullmatch(r"bytes=(\d+)-", rng)[1])  # type: ignore[index]
                status = 206
                if start >= len(body):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(body)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
            part = body[start:]
            key = self.path.split("?", 1)[0]
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            if key in hub.no_length and send_body:
                self.close_connection = True
            else:
                self.send_header("Content-Length", str(len(part)))
            self.end_headers()
            if not send_body:
                return
            self._hold(key)
            cut = hub.drop_after.pop(key, hub.drop_every.get(key))
            if cut is not None:  # break the connection mid-body, once
                self.wfile.write(part[:cut])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(part)

        def _hold(self, key: str) -> None:
            """Wait (up to hub.hold[key] seconds) until another GET of the same path arrives: two clients then
            download at the same time, unless something keeps the second one from asking."""
            with hub._arrived:
                hub._gets[key] = hub._gets.get(key, 0) + 1
                hub._arrived.notify_all()
                if key in hub.hold:
                    hub._arrived.wait_for(lambda: hub._gets[key] >= 2, hub.hold[key])

        def do_HEAD(self) -> None:
            self._answer(send_body=False)

        def do_GET(self) -> None:
            self._answer(send_body=True)

    return Handler


@contextmanager
def serve(hub: FakeHub) -> Iterator[FakeHub]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    server.daemon_threads = True
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()


def use(hub: FakeHub, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Point this test at the fake hub: HF_ENDPOINT, a cache under tmp_path, online. huggingface_hub reads some
    settings at import time, so those are pointed at the test's own places as well; its registry fetch (a call to
    the real endpoint) is switched off, and resolving any host other than localhost fails the test."""
    import huggingface_hub.constants as hf_constants

    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(hf_constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    try:  # newer clients fetch an "agent harness" registry from the endpoint read at import time
        import huggingface_hub.utils._detect_agent as detect_agent

        monkeypatch.setattr(detect_agent, "_fetch_registry", lambda: None)
    except ImportError:
        pass
    monkeypatch.setattr(socket, "getaddrinfo", _local_only(socket.getaddrinfo))


def _local_only(real: Any) -> Any:
    import pytest

    def getaddrinfo(host: Any, *args: Any, **kw: Any) -> Any:
        if host not in ("127.0.0.1", "localhost", "::1", b"127.0.0.1", b"localhost"):
            pytest.fail(f"a test tried to reach {host!r}")
        return real(host, *args, **kw)

    return getaddrinfo


class NoSleep:
    """Stands in for the `time` module: huggingface_hub's retry backoff without the waiting."""

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    @staticmethod
    def sleep(_s: float) -> None:
        pass
