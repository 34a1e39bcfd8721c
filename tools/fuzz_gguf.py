"""Fuzz cuca's GGUF loading: mutate small valid files and run each case in a forked child through
open -> load -> a short generation and a chat render, counting outcomes by class.

Classes: `typed` (a CucaError), `loaded` (loaded; the request then raised a CucaError), `generated` (a reply),
`exception` (any other exception: a bug), `signal` (the child died of a signal: a crash), `hang` (past
--timeout CPU seconds), `memory` (peak RSS over --max-rss-mib). Only the first three are acceptable.

    python tools/fuzz_gguf.py --cases 20000 --jobs 2 --seed 1 --out /tmp/fuzz   # a long campaign
    python tools/fuzz_gguf.py --replay /tmp/fuzz/exception-00123.gguf           # one case, in this process

Seeds are tiny synthetic llama, gemma3, gemma4 and qwen35 files (tests/synth*.py, tools/synth_qwen35.py).
Mutations work on the file's structure (tools: `parse`/`build`) as well as its bytes: byte flips, truncations,
hostile tensor/key counts, string lengths, dims, offsets, tensor and value types, general.alignment, duplicated keys
and tensors, non-UTF-8 strings, hostile hyperparameter values, dropped keys/tensors, hostile chat templates.
Failing cases are written to --out for replay. Forking from a parent that has imported numpy and cuca (and never
run a kernel, so no OpenMP pool exists yet) keeps a case at tens of milliseconds.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before numpy: every child runs single-threaded
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import collections  # noqa: E402
import random  # noqa: E402
import resource  # noqa: E402
import signal  # noqa: E402
import struct  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tools")]

OK_CLASSES = ("typed", "loaded", "generated")
CLASSES = (*OK_CLASSES, "exception", "signal", "hang", "memory")

# ---- a structural GGUF codec (values keep their GGUF type, so a mutation can change exactly one thing) ----
_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


@dataclass
class KV:
    key: bytes
    vtype: int
    value: Any  # scalar; bytes for STRING; (subtype, [items]) for ARRAY


@dataclass
class Tensor:
    name: bytes
    ne: list[int]
    ggml_type: int
    offset: int


@dataclass
class Gguf:
    version: int
    kvs: list[KV]
    tensors: list[Tensor]
    data: bytes
    n_kv: int | None = None  # header counts when they should lie
    n_tensors: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class _Reader:
    def __init__(self, raw: bytes):
        self.raw, self.pos = raw, 0

    def take(self, fmt: str) -> Any:
        v = struct.unpack_from(fmt, self.raw, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def bytes_(self) -> bytes:
        n = self.take("<Q")
        out = self.raw[self.pos : self.pos + n]
        self.pos += n
        return out

    def value(self, vtype: int) -> Any:
        if vtype == STRING:
            return self.bytes_()
        if vtype == ARRAY:
            sub, n = self.take("<I"), self.take("<Q")
            return (sub, [self.value(sub) for _ in range(n)])
        return self.take(_FMT[vtype])


def parse(raw: bytes) -> Gguf:
    """A valid file -> its structure (the data section starts at the aligned end of the header)."""
    r = _Reader(raw)
    assert r.raw[:4] == b"GGUF"
    r.pos = 4
    version, n_t, n_kv = r.take("<I"), r.take("<Q"), r.take("<Q")
    kvs = []
    for _ in range(n_kv):
        key = r.bytes_()
        vtype = r.take("<I")
        kvs.append(KV(key, vtype, r.value(vtype)))
    tensors = []
    for _ in range(n_t):
        name = r.bytes_()
        ne = [r.take("<Q") for _ in range(r.take("<I"))]
        tensors.append(Tensor(name, ne, r.take("<I"), r.take("<Q")))
    align = next((kv.value for kv in kvs if kv.key == b"general.alignment"), 32)
    start = -(-r.pos // align) * align
    return Gguf(version, kvs, tensors, raw[start:])


def _enc_value(vtype: int, v: Any) -> bytes:
    if vtype == STRING:
        return struct.pack("<Q", len(v)) + v
    if vtype == ARRAY:
        sub, items = v
        return struct.pack("<IQ", sub, len(items)) + b"".join(_enc_value(sub, x) for x in items)
    if vtype == 6 and abs(v) > 3.4e38:  # what a float32 key too large for float32 holds
        v = v * float("inf")
    return struct.pack(_FMT[vtype], v)


def build(g: Gguf, align: int = 32) -> bytes:
    """The structure -> bytes; the data section is padded to `align` (or a sane general.alignment)."""
    out = [b"GGUF", struct.pack("<IQQ", g.version, len(g.tensors) if g.n_tensors is None else g.n_tensors,
                                len(g.kvs) if g.n_kv is None else g.n_kv)]
    for kv in g.kvs:
        out += [struct.pack("<Q", len(kv.key)), kv.key, struct.pack("<I", kv.vtype), _enc_value(kv.vtype, kv.value)]
    for t in g.tensors:
        out += [struct.pack("<Q", len(t.name)), t.name, struct.pack("<I", len(t.ne))]
        out += [struct.pack("<Q", d & (2**64 - 1)) for d in t.ne] + [struct.pack("<IQ", t.ggml_type, t.offset)]
    head = b"".join(out)
    a = next((kv.value for kv in g.kvs if kv.key == b"general.alignment" and kv.vtype in (4, 10)), align)
    a = a if isinstance(a, int) and 8 <= a <= 4096 and not a & (a - 1) else align
    return head + b"\0" * (-len(head) % a) + g.data


def set_kv(g: Gguf, key: str, vtype: int, value: Any) -> Gguf:
    """`key` set to (vtype, value), replacing the first entry of that key or appended."""
    k = key.encode()
    for kv in g.kvs:
        if kv.key == k:
            kv.vtype, kv.value = vtype, value
            return g
    g.kvs.append(KV(k, vtype, value))
    return g


# ---- seeds ------------------------------------------------------------------------------------------------
def make_seeds(folder: Path) -> dict[str, bytes]:
    """Tiny valid files, one per architecture."""
    import synth
    import synth_gemma4
    import synth_qwen35

    seeds = {}
    for arch in ("llama", "gemma3"):
        p = synth.write_tiny(folder / f"{arch}.gguf", arch=arch,
                             shape=synth.Tiny(n_vocab=300, n_embd=32, n_head=2, n_head_kv=1, head_dim=16, n_ff=32))
        seeds[arch] = p.read_bytes()
    s = synth_gemma4.TINY
    seeds["gemma4"] = synth_gemma4.write_gemma4(folder / "gemma4.gguf", s).read_bytes()
    seeds["qwen35"] = synth_qwen35.write(folder / "qwen35.gguf", synth_qwen35.TINY).read_bytes()
    return seeds


# ---- mutations (each takes the parsed seed, the raw seed and a Random; returns the bytes to load) ----------
HOSTILE_INTS = [0, 1, 2, 3, 7, 8, 31, 2**15, 2**16 + 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**64 - 1]
HOSTILE_VALUES: list[tuple[int, Any]] = (
    [(4, v) for v in HOSTILE_INTS if v < 2**32] + [(10, v) for v in HOSTILE_INTS] + [(5, -1), (11, -(2**63))]
    + [(6, v) for v in (0.0, -1.0, 1e-45, 1e38, float("inf"), float("-inf"), float("nan"))]
    + [(12, v) for v in (1e300, float("nan"), -0.0)] + [(7, True), (7, False)]
    + [(STRING, b"12"), (STRING, b"\xff\xfe"), (ARRAY, (4, [1, 2])), (ARRAY, (STRING, [b"x"])), (ARRAY, (4, []))]
)
TEMPLATES = [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{{ 'x' * 2 * 10**9 }}", "{{ (10**1000)**1000 }}", "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "{% set ns = namespace(s='x') %}{% for i in range(80) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "{{ '%0999999999d' % 1 }}", "{{ ('a'*100000)|replace('a', 'b'*100000) }}", "{{ raise_exception('no') }}",
    "{{ messages[10] }}", "{{ 1/0 }}", "{% for", "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}",
    "{{ ''.__class__.__mro__ }}", "{{ messages|tojson(indent=100000) }}",
]


def _pick_kv(g: Gguf, rng: random.Random, hyper: bool = False) -> KV:
    arch = next((kv.value for kv in g.kvs if kv.key == b"general.architecture" and kv.vtype == STRING), b"?")
    pool = [kv for kv in g.kvs if kv.key.startswith(arch + b".")] if hyper else g.kvs
    return rng.choice(pool or g.kvs)


def m_flip(g: Gguf, raw: bytes, rng: random.Random) -> bytes:
    b = bytearray(raw)
    limit = min(len(b), rng.choice([64, 512, 4096, len(b)]))  # mostly the header
    for _ in range(rng.randint(1, 8)):
        b[rng.randrange(limit)] ^= 1 << rng.randrange(8)
    return bytes(b)


def m_truncate(g: Gguf, raw: bytes, rng: random.Random) -> bytes:
    return raw[: rng.randrange(len(raw))]


def m_counts(g: Gguf, raw: bytes, rng: random.Random) -> bytes:
    v = rng.choice(HOSTILE_INTS + [len(g.kvs) + 1, len(g.kvs) - 1, len(g.tensors) + 1, len(g.tensors) - 1])
    if rng.random() < 0.5:
        g.n_kv = v % 2**64
    else:
        g.n_tensors = v % 2**64
    return build(g)


def m_length(g: Gguf, raw: bytes, rng: random.Random) -> bytes:
    """A string length field that lies: patch the length prefix of a key, a value or a tensor name."""
    out = bytearray(build(g))
    needle = rng.choice([kv.key for kv in g.kvs] + [t.name for t in g.tensors])
    at = out.find(struct.pack("<Q", len(needle)) + needle)
    if at >= 0:
        out[at : at + 8] = struct.pack("<Q", rng.choice(HOSTILE_INTS + [len(needle) + 1, len(needle) - 1]) % 2**64)
    return bytes(out)


def m_dims(g: Gguf, raw: bytes, rng: random.Random) -> bytes:
    t = rng.choice(g.tensors)
    if rng.random() < 0.2:
        t.ne = t.ne + [1] if rng.random() < 0.5 else t.ne[:1] * rng.choice([0, 5])
    else:
        i = rng.randrange(len(t.ne))
        t.ne[i] = rng.choice(HOSTILE_INTS + [t.ne[i] * 2, t.ne[i] // 2, t.ne[i] + 32])
    return build(g)


def m_offset(g: Gguf, raw: bytes, rng: random.Random) -> bytes:
    t = rng.choice(g.tensors)
    t.offset = rng.choice(HOSTILE_INTS + [t.offset + 1, t.offset + 32, 0, len(g.data)]) % 2**64
    return build(g)


def m_tensor_type(g: Gguf, raw: bytes, rng: random.Random) -> bytes:
    t = rng.choice(g.tensors)
    t.ggml_type = rng.choice([0, 1, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 24, 26, 28, 30, 39, 41, 1234])
    return build(g)


def m_value_type(g: Gguf, raw: bytes, rng: random.Random) -> bytes:
    kv = _pick_kv(g, rng, hyper=rng.random() < 0.7)
    kv.vtype, kv.value = rng.choice(HOSTILE_VALUES)
    return build(g)


def m_alignment(g: Gguf, raw: bytes, rng: random.Random) -> bytes:
    vtype, v = rng.choice([(4, 0), (4, 1), (4, 2), (4, 3), (4, 7), (4, 8), (4, 16), (4, 64), (4, 2**31), (7, True),
                           (6, 32.0), (STRING, b"32"), (10, 32), (5, -32)])
    return build(set_kv(g, "general.alignment", vtype, v))


def m_duplicate(g: Gguf, raw: bytes, rng: random.Random) -> bytes:
    if rng.random() < 0.5:
        kv = _pick_kv(g, rng, hyper=True)
        g.kvs.insert(rng.randrange(len(g.kvs) + 1), KV(kv.key, kv.vtype, kv.value))
    else:
        t = rng.choice(g.tensors)
        g.tensors.insert(rng.randrange(len(g.tensors) + 1), Tensor(t.name, list(t.ne), t.ggml_type, t.offset))
    return build(g)


def m_utf8(g: Gguf, raw: bytes, rng: random.Random) -> bytes:
    bad = rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00"])
    r = rng.random()
    if r < 0.3:
        kv = rng.choice(g.kvs)
        kv.key += bad
    elif r < 0.6:
        t = rng.choice(g.tensors)
        t.name += bad
    else:
        strings = [kv for kv in g.kvs if kv.vtype == STRING or (kv.vtype == ARRAY and kv.value[0] == STRING)]
        kv = rng.choice(strings)
        if kv.vtype == STRING:
            kv.value += bad
        elif kv.value[1]:
            items = list(kv.value[1])
            items[rng.randrange(len(items))] += bad
            kv.value = (STRING, items)
    return build(g)


def m_hyper(g: Gguf, raw: bytes, rng: random.Random) -> bytes:
    """One hyperparameter set to a hostile value of its own type (0, -1, 2^31, NaN, ...)."""
    kv = _pick_kv(g, rng, hyper=True)
    if kv.vtype in (4, 5, 10, 11):
        kv.value = rng.choice([0, 1, 3, 2**16, 2**31 - 1, kv.value + 1, kv.value * 2, max(0, kv.value - 1)])
        if kv.vtype == 4:
            kv.value %= 2**32
    elif kv.vtype in (6, 12):
        kv.value = rng.choice([0.0, -1.0, 1e-45, 1e39, float("inf"), float("nan"), kv.value * 1e6])
    elif kv.vtype == ARRAY:
        sub, items = kv.value
        kv.value = (sub, items[: rng.randrange(len(items) + 1)] if rng.random() < 0.5 else items * 2)
    else:
        kv.vtype, kv.value = rng.choice(HOSTILE_VALUES)
    return build(g)


def m_drop(g: Gguf, raw: bytes, rng: random.Random) -> bytes:
    if rng.random() < 0.5:
        g.kvs.remove(_pick_kv(g, rng, hyper=rng.random() < 0.5))
    else:
        g.tensors.remove(rng.choice(g.tensors))
    return build(g)


def m_vocab(g: Gguf, raw: bytes, rng: random.Random) -> bytes:
    for kv in g.kvs:
        if kv.key == b"tokenizer.ggml.tokens":
            sub, items = kv.value
            extra = [b"extra%d" % i for i in range(rng.choice([1, 100, 1000]))]
            kv.value = (sub, items + extra if rng.random() < 0.7 else items[: rng.randrange(1, len(items))])
        elif kv.key.endswith(b"_token_id") and rng.random() < 0.5:
            kv.value = rng.choice([0, 2**31, 2**32 - 1]) if kv.vtype == 4 else kv.value
    return build(g)


def m_template(g: Gguf, raw: bytes, rng: random.Random) -> bytes:
    return build(set_kv(g, "tokenizer.chat_template", STRING, rng.choice(TEMPLATES).encode()))


MUTATIONS: list[Callable[[Gguf, bytes, random.Random], bytes]] = [
    m_flip, m_flip, m_truncate, m_counts, m_length, m_dims, m_dims, m_offset, m_tensor_type, m_value_type,
    m_value_type, m_alignment, m_duplicate, m_utf8, m_hyper, m_hyper, m_hyper, m_drop, m_vocab, m_template,
]


def mutate(raw: bytes, rng: random.Random) -> tuple[str, bytes]:
    """One to three mutations of a seed; returns their names and the bytes."""
    names = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        m = rng.choice(MUTATIONS)
        try:
            g = parse(raw)
        except Exception:  # an earlier mutation broke the structure: keep mutating bytes
            m = rng.choice([m_flip, m_truncate])
            g = Gguf(3, [], [], b"")
        if not g.kvs or not g.tensors:
            m = rng.choice([m_flip, m_truncate])
        try:
            raw = m(g, raw, rng)
        except Exception:  # an earlier mutation changed what this one edits (a type, a length): flip bytes
            m = m_flip
            raw = m(g, raw, rng)
        names.append(m.__name__[2:])
    return "+".join(names), raw


# ---- running one case -----------------------------------------------------------------------------------
def run_case(path: str) -> str:
    """open -> load -> a 4-token generation and a chat request; the outcome class (and the error)."""
    from cuca.cli import file_info
    from cuca.errors import CucaError
    from cuca.local import LocalModel, LocalModelConfig

    stage = "typed"
    try:
        file_info(path)  # what `cuca info` reads
        m = LocalModel(LocalModelConfig(source=path, threads=1, context_length=64))
        stage = "loaded"
        m.complete_sync("hello world", max_tokens=4)
        m.chat_sync([{"role": "user", "content": "hi"}], max_tokens=2)
        return "generated"
    except CucaError as e:
        return f"{stage} {type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001  (what the fuzzer looks for)
        import traceback

        return f"exception {type(e).__name__}: {e}\n{traceback.format_exc()}"


def _child(path: str, wfd: int, timeout: float, max_as: int) -> None:
    # a hang is CPU time past `timeout` (SIGXCPU: independent of how loaded the machine is) or wall time past
    # 20 x `timeout` (SIGALRM: a deadlock burns no CPU)
    cpu = max(1, int(timeout))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.signal(signal.SIGXCPU, signal.SIG_DFL)
    signal.setitimer(signal.ITIMER_REAL, 20 * timeout)
    resource.setrlimit(resource.RLIMIT_AS, (max_as, max_as))
    try:
        msg = run_case(path)
    except BaseException as e:  # noqa: BLE001  (MemoryError escaping the handler, SystemExit, ...)
        msg = f"exception {type(e).__name__}: {e}"
    os.write(wfd, msg.encode("utf-8", "replace")[:8192])
    os._exit(0)


def _vm_size() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


@dataclass
class Running:
    pid: int
    rfd: int
    case: int
    label: str
    data: bytes
    buf: bytearray = field(default_factory=bytearray)


def fork_case(path: str, data: bytes, case: int, label: str, args: argparse.Namespace) -> Running:
    Path(path).write_bytes(data)
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        _child(path, wfd, args.timeout, _vm_size() + (args.max_rss_mib + 1024) * 2**20)
    os.close(wfd)
    return Running(pid, rfd, case, label, data)


def reap(r: Running, args: argparse.Namespace) -> tuple[str, str]:
    while chunk := os.read(r.rfd, 65536):
        r.buf += chunk
    os.close(r.rfd)
    _, status, usage = os.wait4(r.pid, 0)
    msg = r.buf.decode("utf-8", "replace")
    if usage.ru_maxrss * 1024 > args.max_rss_mib * 2**20:
        return "memory", f"peak RSS {usage.ru_maxrss // 1024} MiB; {msg}"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig in (signal.SIGALRM, signal.SIGXCPU, signal.SIGKILL):
            return "hang", f"past {args.timeout} CPU s or {20 * args.timeout} s ({signal.Signals(sig).name})"
        return "signal", signal.Signals(sig).name
    if not msg:
        return "exception", f"child exited with {os.WEXITSTATUS(status)} and no report"
    return msg.split(" ", 1)[0], msg


def campaign(args: argparse.Namespace) -> collections.Counter[str]:
    """Run --cases cases (the unmutated seeds first), --jobs at a time; print and return the counts."""
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    import cuca.cli  # noqa: F401  (imported once here, not in every child)
    import cuca.local  # noqa: F401

    counts: collections.Counter[str] = collections.Counter()
    by_mutation: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as tmp:
        seeds = make_seeds(Path(tmp))
        names = sorted(seeds)
        running: list[Running] = []
        t0 = time.monotonic()
        for case in range(args.first, args.cases):
            arch = names[case % len(names)]
            rng = random.Random(f"{args.seed}:{case}")  # each case on its own: a campaign can be split or resumed
            label, data = ("seed", seeds[arch]) if case < len(names) else mutate(seeds[arch], rng)
            running.append(fork_case(f"{tmp}/case{case % args.jobs}-{len(running)}.gguf", data, case,
                                     f"{arch}:{label}", args))
            if len(running) >= args.jobs or case == args.cases - 1:
                for r in running:
                    cls, msg = reap(r, args)
                    if r.label.endswith(":seed") and cls != "generated":  # the unmutated seeds must work
                        raise SystemExit(f"seed {r.label} does not generate: {msg}")
                    counts[cls] += 1
                    by_mutation[r.label.split(":", 1)[1].split("+")[0]][cls] += 1
                    if cls not in OK_CLASSES:
                        print(f"case {r.case} {r.label}: {cls}: {msg.strip()[:2000]}", flush=True)
                        if out:
                            (out / f"{cls}-{r.case:05d}.gguf").write_bytes(r.data)
                running = []
            if args.progress and (case + 1) % args.progress == 0:
                print(f"[case {case + 1}, {time.monotonic() - t0:.0f} s] {dict(counts)}", flush=True)
    tally = ", ".join(f"{c} {counts[c]}" for c in CLASSES)
    print(f"{args.cases - args.first} cases ({args.first}..{args.cases - 1}), seed {args.seed}: {tally}", flush=True)
    if args.by_mutation:
        for m, c in sorted(by_mutation.items()):
            print(f"  {m:<12} " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=1000, help="run cases --first .. --cases - 1")
    ap.add_argument("--first", type=int, default=0, help="resume or split a campaign at this case")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1, help="cases run at once")
    ap.add_argument("--timeout", type=float, default=20.0, help="CPU seconds before a case counts as a hang")
    ap.add_argument("--max-rss-mib", type=int, default=2048, help="peak RSS above this counts as memory")
    ap.add_argument("--out", help="write failing cases here")
    ap.add_argument("--progress", type=int, default=0, help="print counts every N cases")
    ap.add_argument("--by-mutation", action="store_true", help="print counts per first mutation")
    ap.add_argument("--replay", help="run one file in this process and print its outcome")
    args = ap.parse_args(argv)
    if args.replay:
        print(run_case(args.replay))
        return 0
    counts = campaign(args)
    return 0 if all(counts[c] == 0 for c in CLASSES if c not in OK_CLASSES) else 1


if __name__ == "__main__":
    sys.exit(main())
