"""`cuca serve` as a real subprocess on a free 127.0.0.1 port: started, waited for (/health, with a deadline) and
killed at the end."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

START_DEADLINE_S = 90.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(model: str | Path, *args: str) -> Iterator[str]:
    """The server's base URL (http://127.0.0.1:PORT) while it runs; its log is in the error if it fails to start."""
    port = free_port()
    log = tempfile.NamedTemporaryFile("w+", prefix="cuca-serve-", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "cuca.cli", "serve", str(model), "--port", str(port), "--threads", "1", *args]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_DEADLINE_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"cuca serve exited with {proc.returncode}: {Path(log.name).read_text()[-2000:]}")
            try:
                if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"cuca serve did not answer /health in {START_DEADLINE_S:.0f} s: "
                                   f"{Path(log.name).read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()
        os.unlink(log.name)


