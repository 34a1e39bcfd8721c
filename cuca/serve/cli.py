"""The `cuca serve` command: load the model, then run the app on uvicorn (127.0.0.1 unless told otherwise)."""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from pathlib import Path
from typing import Any

from ..errors import ConfigError, CucaError

LOOPBACK = ("localhost",)


def add_serve_parser(sub: Any, add_model: Any) -> argparse.ArgumentParser:
    s = sub.add_parser("serve", help="an OpenAI-compatible HTTP server for one model (needs the serve extra)")
    add_model(s)
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)")
    s.add_argument("--api-key", default=os.environ.get("CUCA_API_KEY"),
                   help="require Authorization: Bearer KEY (default: $CUCA_API_KEY, else none)")
    s.add_argument("--max-queue", type=int, default=64,
                   help="requests that may wait behind the running ones; more get 429 (default 64)")
    s.add_argument("--parallel", type=int, default=1,
                   help="requests served at once, each with its own cache slot, every pass shared (continuous "
                        "batching; each reply is the one it gets alone); default 1")
    s.add_argument("--name", default=None, help="the model name clients send (default: the file's name)")
    return s


def is_loopback(host: str) -> bool:
    if host in LOOPBACK:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run_serve(a: argparse.Namespace, load: Any) -> int:
    if not 0 <= a.port <= 65535:
        raise ConfigError(f"--port must be in 0..65535, got {a.port}")
    if a.max_queue < 0:
        raise ConfigError(f"--max-queue must be >= 0, got {a.max_queue}")
    try:
        import uvicorn

        from .app import ServeConfig, create_app
    except ImportError as e:
        raise CucaError(f"cuca serve needs the serve extra ({e.name} is missing): pip install 'cuca[serve]'") \
            from None
    if not is_loopback(a.host) and not a.api_key:
        print(f"cuca: warning: serving on {a.host} without --api-key: anyone who can reach this address can use "
              "the model", file=sys.stderr)
    model = load(a)
    name = a.name or Path(model.path).name.removesuffix(".gguf")
    app = create_app(model, ServeConfig(name, a.api_key or None, a.max_queue, (str(a.model),)))
    print(f"[cuca serve: {name} on http://{a.host}:{a.port}/v1]", file=sys.stderr, flush=True)
    uvicorn.run(app, host=a.host, port=a.port, log_level="warning", timeout_graceful_shutdown=2)
    model.close()
    return 0
