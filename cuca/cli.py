"""Command line: `cuca generate MODEL ...`. Builds config objects and prints; no inference logic here."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from .engine import Generation
from .errors import CucaError
from .local import LocalModel, LocalModelConfig


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="cuca", description="Fast, exact, in-process LLM inference on GGUF files")
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="generate a continuation or a chat reply")
    g.add_argument("model", help="a GGUF path or a preset name")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="raw text to continue")
    src.add_argument("--chat", help="a user message, rendered with the model's chat template")
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--threads", type=int, default=0)
    g.add_argument("--context-length", type=int, default=0)
    g.add_argument("--drafter", default=None, help="prompt-lookup, in-trunk, or a drafter GGUF path / preset")
    g.add_argument("--draft-tokens", type=int, default=3)
    g.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    return ap


def _generate(a: argparse.Namespace) -> int:
    model = LocalModel.load_sync(
        LocalModelConfig(
            a.model, drafter=a.drafter, draft_tokens=a.draft_tokens, context_length=a.context_length, threads=a.threads
        )
    )
    if a.chat is not None:
        ids = model.chat_prompt([{"role": "user", "content": a.chat}])
    else:
        ids = model.prompt_ids(a.prompt)
    gen = Generation()
    kw: dict[str, Any] = dict(
        max_tokens=a.max_tokens, temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, seed=a.seed
    )
    pieces = model.stream_ids_sync(ids, gen=gen, **kw)
    if a.json:
        text = "".join(pieces)
        t = gen.timings
        out: dict[str, Any] = {
            "text": text,
            "tokens": gen.tokens,
            "finish_reason": gen.finish_reason,
            "n_prompt_tokens": t.n_prompt,
            "n_generated": t.n_generated,
            "prompt_tokens_per_second": round(t.prompt_tokens_per_second, 3),
            "tokens_per_second": round(t.tokens_per_second, 3),
        }
        if gen.draft is not None:
            out["draft"] = gen.draft.to_dict()
        print(json.dumps(out, ensure_ascii=False))
    else:
        for piece in pieces:
            sys.stdout.write(piece)
            sys.stdout.flush()
        t = gen.timings
        sys.stdout.write("\n")
        sys.stdout.flush()
        line = (
            f"[{t.n_prompt} prompt tokens at {t.prompt_tokens_per_second:.1f} tok/s, "
            f"{t.n_generated} generated at {t.tokens_per_second:.1f} tok/s, finish: {gen.finish_reason}"
        )
        if gen.draft is not None:
            rate = gen.draft.acceptance_rate()
            line += f", drafted {gen.draft.drafted}, accepted {gen.draft.accepted}"
            line += f" ({rate:.0%})" if rate is not None else ""
        print(line + "]", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    try:
        if a.cmd == "generate":
            return _generate(a)
    except CucaError as e:
        print(f"cuca: error: {e}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
