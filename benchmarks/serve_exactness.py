"""By hand, through the official `openai` client: 16 concurrent clients against `cuca serve --parallel 16`
(continuous batching) get, character for character, the replies the same requests get one at a time from
`cuca serve --parallel 1`: chat and completions, streaming and not, greedy and seeded sampling, mixed lengths.

    python benchmarks/serve_exactness.py [--model gemma3-270m-q4_k_m] [--clients 16] [--threads 2] [--drafter D]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from serving import serving  # noqa: E402

TOPICS = ("the sea", "a lighthouse", "bread", "winter", "a fox", "old maps", "rain", "a violin", "mountains",
          "a library", "trains", "the moon", "a garden", "coffee", "a clock", "bees")


def request(i: int) -> dict[str, Any]:
    """Request i: chat or completion, streamed or not, greedy or seeded sampling, 8..68 tokens."""
    kw: dict[str, Any] = {"max_tokens": 8 + (i * 17) % 61, "temperature": 0.0}
    if i % 3 == 1:
        kw.update(temperature=0.8, top_p=0.95, seed=1000 + i)
    text = f"Write a story about {TOPICS[i % len(TOPICS)]}" + (", in great detail, " * (i % 4)) + "."
    return {"chat": i % 2 == 0, "stream": i % 4 < 2, "text": text, "kw": kw}


def ask(c: OpenAI, r: dict[str, Any]) -> str:
    if r["chat"]:
        msgs = [{"role": "user", "content": r["text"]}]
        if r["stream"]:
            s = c.chat.completions.create(model="m", messages=msgs, stream=True, **r["kw"])  # type: ignore[call-overload]
            return "".join((ch.choices[0].delta.content or "") for ch in s if ch.choices)
        return c.chat.completions.create(model="m", messages=msgs, **r["kw"]).choices[0].message.content or ""  # type: ignore[call-overload]
    if r["stream"]:
        s = c.completions.create(model="m", prompt=r["text"], stream=True, **r["kw"])  # type: ignore[call-overload]
        return "".join(ch.choices[0].text for ch in s if ch.choices)
    return c.completions.create(model="m", prompt=r["text"], **r["kw"]).choices[0].text  # type: ignore[call-overload]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gemma3-270m-q4_k_m")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--drafter", default=None, help="the servers' --drafter (default: none)")
    a = ap.parse_args()
    reqs = [request(i) for i in range(a.clients)]
    args = ("--threads", str(a.threads), "--name", "m", "--context-length", "1024",
            *(("--drafter", a.drafter) if a.drafter else ()))
    with serving(a.model, *args, "--parallel", "1") as u:
        c = OpenAI(base_url=u + "/v1", api_key="none")
        alone = [ask(c, r) for r in reqs]
    got: list[str | None] = [None] * len(reqs)
    with serving(a.model, *args, "--parallel", str(a.clients)) as u:
        c = OpenAI(base_url=u + "/v1", api_key="none", max_retries=0, timeout=600)

        def client(i: int) -> None:
            time.sleep(0.05 * (i % 5))  # staggered arrivals
            got[i] = ask(c, reqs[i])

        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(reqs))]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
    same = [g == w for g, w in zip(got, alone, strict=True)]
    for i, (r, ok) in enumerate(zip(reqs, same, strict=True)):
        kind = f"{'chat' if r['chat'] else 'completion'}{' stream' if r['stream'] else ''}"
        mode = "greedy" if r["kw"]["temperature"] == 0 else f"seed {r['kw']['seed']}"
        print(f"request {i:2d} {kind:<17} {mode:<9} max_tokens {r['kw']['max_tokens']:2d}: "
              f"{len(alone[i]):4d} chars, {'identical' if ok else 'DIFFERENT'}")
    print(f"{sum(same)}/{len(same)} replies identical to the request alone ({len(reqs)} concurrent clients, "
          f"{wall:.1f} s batched)")
    sys.exit(0 if all(same) else 1)


if __name__ == "__main__":
    main()
