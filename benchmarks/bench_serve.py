"""bench_serve: `cuca serve` without batching (--parallel 1), with continuous batching (--parallel P) and a native
llama-server --parallel P (continuous batching on; the performance issue's peer build) on the same GGUF file and
thread count, in one run: 1, 2, 4, 8 and 16 concurrent streaming clients asking for 64-token chat replies (greedy);
aggregate tokens/s and requests/s (medians over the rounds), p50/p95 time to first token and inter-token latency
(the gaps between streamed pieces, over every request). The servers take turns at each level, the order rotating.
Optionally first (--turn3-reps N) the prompt cache: time to first token of turn 3 of a chat with and without it
(in-process LocalModel, interleaved, medians) and the rows each prefilled.

    python benchmarks/bench_serve.py                          # SmolLM2-135M, 2 threads, 1 2 4 8 16 clients
    python benchmarks/bench_serve.py --model gemma3-270m-q4_k_m /work/bench/qwen35-0.8b-synth-q8_0.gguf --json o.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from serving import free_port, serving  # noqa: E402

from cuca import LocalModel, LocalModelConfig  # noqa: E402
from cuca.bench.peer import peer_bin  # noqa: E402
from cuca.engine import Generation  # noqa: E402
from cuca.sources import ModelSource  # noqa: E402

TOPICS = ("the sea", "a lighthouse", "bread", "winter", "a fox", "old maps", "rain", "a violin", "mountains",
          "a library", "trains", "the moon", "a garden", "coffee", "a clock", "bees")
SYSTEM = ("You are a helpful assistant who answers questions about geography, history and science. " * 24).strip()


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


async def one(c: httpx.AsyncClient, model: str, topic: str, max_tokens: int) -> tuple[float, int, list[float]]:
    """One streaming chat request: (seconds to the first text piece, completion tokens, seconds between pieces)."""
    body = {"model": model, "messages": [{"role": "user", "content": f"Write a long story about {topic}."}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first, pieces, usage, stamps = None, 0, None, []
    async with c.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices") or []:
                if (ch.get("delta") or {}).get("content"):
                    pieces += 1
                    stamps.append(time.perf_counter())
                    first = first if first is not None else stamps[-1] - t0
    n = int(usage["completion_tokens"]) if usage else pieces
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return (first if first is not None else time.perf_counter() - t0), n, gaps


async def level(url: str, model: str, clients: int, n_requests: int, max_tokens: int) -> dict[str, Any]:
    todo = list(range(n_requests))
    ttft: list[float] = []
    itl: list[float] = []
    tokens = 0

    async def client(c: httpx.AsyncClient) -> None:
        nonlocal tokens
        while todo:
            i = todo.pop(0)
            t, n, gaps = await one(c, model, TOPICS[i % len(TOPICS)], max_tokens)
            ttft.append(t)
            itl.extend(gaps)
            tokens += n

    t0 = time.perf_counter()
    # a fresh connection per request: llama-server drops a kept-alive connection after a stream
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as c:
        await asyncio.gather(*(client(c) for _ in range(clients)))
    wall = time.perf_counter() - t0
    return {"clients": clients, "requests": n_requests, "seconds": wall, "requests_per_s": n_requests / wall,
            "tokens": tokens, "tokens_per_s": tokens / wall, "ttft_s": ttft, "itl_s": itl}


class LlamaServer:
    """A native llama-server with `parallel` slots (continuous batching on, its default) on the same file and
    threads, each slot with `n_ctx` positions (started, waited for, stopped)."""

    def __init__(self, path: Path, threads: int, n_ctx: int, parallel: int = 1, extra: tuple[str, ...] = ()):
        b = peer_bin()
        if b is None:
            raise SystemExit("no llama.cpp peer build: run benchmarks/peer/build_llamacpp.sh (or --no-llama)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [str(b / "llama-server"), "-m", str(path), "--host", "127.0.0.1", "--port", str(self.port),
               "-t", str(threads), "-tb", str(threads), "--parallel", str(parallel), "-c", str(n_ctx * parallel),
               "--cont-batching", "--log-disable", *extra]
        self.cmd = " ".join(cmd)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"llama-server did not start: {self.cmd}")
            time.sleep(0.3)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def turn3_ttft(path: Path, threads: int, reps: int, max_tokens: int) -> dict[str, Any]:
    """Time to first token of turn 3 (a long system message, two earlier turns) with and without the prompt cache:
    the warm model serves turns 1 and 2 before each timed turn 3; the cold one serves turn 3 alone."""
    warm = LocalModel.load_sync(LocalModelConfig(path, threads=threads))
    cold = LocalModel.load_sync(LocalModelConfig(path, threads=threads, prompt_cache=False))
    msgs: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    for q in ("Where is the Nile?", "How long is it?"):
        msgs.append({"role": "user", "content": q})
        msgs.append({"role": "assistant", "content": cold.chat_sync(msgs, max_tokens=max_tokens).text})
    turn3 = [*msgs, {"role": "user", "content": "Which countries does it cross?"}]

    def first_piece(m: LocalModel) -> tuple[float, Generation]:
        gen = Generation()
        t0 = time.perf_counter()
        s = m.stream_chat_sync(turn3, max_tokens=max_tokens, gen=gen)
        next(s)
        t = time.perf_counter() - t0
        for _ in s:
            pass
        return t, gen

    ms: dict[str, list[float]] = {"with": [], "without": []}
    gens: dict[str, Generation] = {}
    for rep in range(reps):
        for name in (("with", "without") if rep % 2 == 0 else ("without", "with")):
            if name == "with":
                for k in (3, 5):  # turns 1 and 2 leave the cache holding the conversation so far
                    warm.chat_sync(msgs[:k], max_tokens=max_tokens)
            t, gens[name] = first_piece(warm if name == "with" else cold)
            ms[name].append(t * 1e3)
    w, c = gens["with"], gens["without"]
    return {"ttft_ms_with_cache": statistics.median(ms["with"]),
            "ttft_ms_without_cache": statistics.median(ms["without"]),
            "samples_ms": {k: [round(v, 1) for v in vs] for k, vs in ms.items()}, "prompt_tokens": w.timings.n_prompt,
            "prefilled_with": w.timings.n_prefilled, "prefilled_without": c.timings.n_prefilled,
            "identical_output": w.tokens == c.tokens}


def summary(name: str, clients: int, rs: list[dict[str, Any]]) -> dict[str, Any]:
    ttft = [t for x in rs for t in x["ttft_s"]]
    itl = [t for x in rs for t in x["itl_s"]] or [0.0]
    return {"server": name, "clients": clients, "requests": rs[0]["requests"], "rounds": rs,
            "requests_per_s": statistics.median(x["requests_per_s"] for x in rs),
            "tokens_per_s": statistics.median(x["tokens_per_s"] for x in rs),
            "ttft_p50_ms": pct(ttft, 0.5) * 1e3, "ttft_p95_ms": pct(ttft, 0.95) * 1e3,
            "itl_p50_ms": pct(itl, 0.5) * 1e3, "itl_p95_ms": pct(itl, 0.95) * 1e3}


def one_model(a: argparse.Namespace, model: str) -> dict[str, Any]:
    """Every level on every server for one model file: cuca without batching (--parallel 1), cuca with it
    (--parallel P), llama-server --parallel P; the servers take turns at each level, the order rotating."""
    path = ModelSource.parse(model).resolve()
    res: dict[str, Any] = {"model": str(path), "levels": []}
    if a.turn3_reps > 0:
        res["turn3"] = turn3_ttft(path, a.threads, a.turn3_reps, 16)
        t = res["turn3"]
        print(f"turn 3 TTFT: {t['ttft_ms_with_cache']:.1f} ms with the prompt cache ({t['prefilled_with']} of "
              f"{t['prompt_tokens']} rows prefilled), {t['ttft_ms_without_cache']:.1f} ms without "
              f"({t['prefilled_without']}); identical output: {t['identical_output']}", flush=True)
    par = a.parallel or max(a.clients)
    common = ("--threads", str(a.threads), "--name", "m", "--context-length", str(a.context_length))
    llama = None if a.no_llama else LlamaServer(path, a.threads, a.context_length, par, tuple(a.llama_args.split()))
    res["llama_cmd"] = llama.cmd if llama else None
    try:
        with serving(path, *common, "--parallel", "1") as plain_url, \
                serving(path, *common, "--parallel", str(par)) as batch_url:
            servers = [("cuca", plain_url), (f"cuca-batch{par}", batch_url)]
            servers += [(f"llama-server-p{par}", llama.url)] if llama else []
            for i, clients in enumerate(a.clients):
                n = max(clients, a.min_requests)
                runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in servers}
                for r in range(a.rounds):  # the servers take turns, the order rotating
                    k = (i + r) % len(servers)
                    for name, u in servers[k:] + servers[:k]:
                        runs[name].append(asyncio.run(level(u, "m", clients, n, a.max_tokens)))
                for name, rs in runs.items():
                    row = summary(name, clients, rs)
                    res["levels"].append(row)
                    print(f"{name:<16} {clients:>3} clients {n:>3} requests x {a.rounds}: {row['tokens_per_s']:6.1f} "
                          f"tok/s (median) TTFT p50 {row['ttft_p50_ms']:6.0f} p95 {row['ttft_p95_ms']:6.0f} ms, "
                          f"ITL p50 {row['itl_p50_ms']:5.1f} p95 {row['itl_p95_ms']:6.1f} ms", flush=True)
    finally:
        if llama:
            llama.close()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", nargs="+", default=["smollm2-135m-instruct-q4_1"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--parallel", type=int, default=0, help="slots of the batching servers (default: most clients)")
    ap.add_argument("--context-length", type=int, default=1024, help="positions per slot (default 1024)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--min-requests", type=int, default=8, help="requests per level at least (default 8)")
    ap.add_argument("--turn3-reps", type=int, default=0, help="turn-3 prompt-cache samples each way (default 0: skip)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each level per server, interleaved (default 2)")
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--llama-args", default="", help="more llama-server options, e.g. '--poll 0'")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    res: dict[str, Any] = {"threads": a.threads, "max_tokens": a.max_tokens, "models": [],
                           "load_before": os.getloadavg()}
    print(f"machine load (1/5/15 min) before: {res['load_before']}", flush=True)
    for model in a.model:
        print(f"== {model}", flush=True)
        res["models"].append(one_model(a, model))
        print(f"machine load (1/5/15 min) now: {os.getloadavg()}", flush=True)
    res["load_after"] = os.getloadavg()
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
