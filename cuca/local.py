"""LocalModel: load a GGUF model in-process and serve completion and chat requests through its scheduler: one worker
thread owns the model and runs requests one at a time, in arrival order, or (`parallel` > 1) a batcher runs up to
`parallel` of them at once, every pass shared, each reply the one it gets alone."""

from __future__ import annotations

import asyncio
import os
import re
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .batcher import Batcher, Lane, LaneModel
from .device import Device
from .engine import Engine, Generation, Timings, check_token_ids
from .errors import ConfigError, ContextLengthError
from .gguf import open_gguf
from .models import load_model
from .models.layers import Ops
from .request import check_request
from .sampling import SamplingParams, is_int
from .scheduler import AsyncStream, Scheduler, SyncStream
from .sources import ModelSource
from .speculative.batch_governor import BatchGovernor, PassClock
from .speculative.decoder import SpeculativeDecoder
from .speculative.drafters import Drafter
from .speculative.drafters.load import check_device, load_drafter, resolve_auto
from .speculative.governor import Governor, SpeedGovernor
from .speculative.source import DrafterSource
from .speculative.stats import DraftStats, RequestDraftStats
from .tokenizer import Tokenizer

MAX_THREADS = 1 << 16  # what the kernels accept
MAX_PARALLEL = 256


@dataclass(frozen=True)
class LocalModelConfig:
    """What to load and how. Drafting is off unless `drafter` is set (a DrafterSource, or a ModelSource / string
    naming a drafter file) and `draft_tokens` is the most drafts per round (the governor picks 0..draft_tokens
    per round); `threads` 0 uses every core; `context_length` 0 uses min(4096, trained length), and a
    length past the trained one needs `allow_long_context=True`; `device` a Device or its name: "cpu" (the C
    backend), "cuda" / "cuda:N" (a CUDA GPU through PyTorch, `pip install "cuca[gpu]"`) or "torch-cpu" (the PyTorch
    backend on CPU tensors: tests and checks without a GPU); `parallel` the requests served at once (continuous
    batching; each has its own cache slot)."""

    source: ModelSource | str | os.PathLike[str] = "gemma3-270m-q4_k_m"
    drafter: DrafterSource | ModelSource | str | None = None
    draft_tokens: int = 3
    context_length: int = 0
    threads: int = 0
    device: Device | str = Device.CPU
    allow_long_context: bool = False
    prompt_cache: bool = True  # keep the previous request's rows that the next prompt shares (output unchanged)
    parallel: int = 1

    def validate(self) -> None:
        if not isinstance(self.source, (ModelSource, str, os.PathLike)):
            raise ConfigError(
                f"source must be a preset name, hf:owner/repo/file.gguf, a URL, a path or a ModelSource, "
                f"got {type(self.source).__name__}"
            )
        if self.drafter is not None and not isinstance(self.drafter, (DrafterSource, ModelSource, str, os.PathLike)):
            raise ConfigError(
                f"drafter must be None, a DrafterSource, a ModelSource or a string, got {type(self.drafter).__name__}"
            )
        if not is_int(self.context_length) or self.context_length < 0:
            raise ConfigError(f"context_length must be an integer >= 0, got {self.context_length!r}")
        if not is_int(self.threads) or not 0 <= self.threads <= MAX_THREADS:
            raise ConfigError(f"threads must be an integer in 0..{MAX_THREADS}, got {self.threads!r}")
        if not is_int(self.draft_tokens) or (self.drafter is not None and self.draft_tokens < 1):
            raise ConfigError(f"draft_tokens must be an integer >= 1 when a drafter is set, got {self.draft_tokens!r}")
        if not is_int(self.parallel) or not 1 <= self.parallel <= MAX_PARALLEL:
            raise ConfigError(f"parallel must be an integer in 1..{MAX_PARALLEL}, got {self.parallel!r}")
        if not isinstance(self.prompt_cache, bool):
            raise ConfigError(f"prompt_cache must be True or False, got {self.prompt_cache!r}")
        if not isinstance(self.allow_long_context, bool):
            raise ConfigError(f"allow_long_context must be True or False, got {self.allow_long_context!r}")
        device, index = Device.locate(self.device)
        if self.drafter is not None:
            check_device(DrafterSource.parse(self.drafter), device)
        device.check_available(index)


@dataclass
class Reply:
    """A finished request: generated text and ids, why it stopped, and how long it took."""

    text: str
    tokens: list[int]
    finish_reason: str
    timings: Timings = field(default_factory=Timings)
    draft: RequestDraftStats | None = None


@dataclass(frozen=True)
class _Plan:
    """One checked request, as the worker runs it: `prompt(room)` tokenizes (on the worker) leaving `room`."""

    prompt: Callable[[int], list[int]]
    max_tokens: int
    params: SamplingParams
    stop: tuple[str, ...]
    gen: Generation
    draft: bool


class LocalModel:
    """A loaded model. Its scheduler's worker thread runs the requests, one at a time, in arrival order (or its
    batcher, `parallel` at a time); sync and async forms may be mixed from any thread. A stream that is closed,
    dropped or whose task is cancelled stops at its next token."""

    def __init__(self, config: LocalModelConfig):
        config.validate()
        self.config = config
        self.source = ModelSource.parse(config.source)
        self.path = self.source.resolve()
        self.file = open_gguf(self.path)
        self.tokenizer = Tokenizer.from_gguf(self.file)
        self.model = load_model(self.file, _ops(config))
        self.engine = Engine(self.model, self._context_length(config), config.prompt_cache)
        device = Device.locate(config.device)[0]
        self.drafter_source = (resolve_auto(DrafterSource.parse(config.drafter), self.model, self.source, device)
                               if config.drafter is not None else None)
        self.drafter: Drafter | None = None
        if self.drafter_source is not None:
            self.drafter = load_drafter(self.drafter_source, self.model, self.engine.cache, self.model.ops, self.path)
        own = getattr(self.drafter, "cache", None)  # a draft model's or an MTP head's own cache
        if own is not None and own is not self.engine.cache:
            self._check_memory(self.engine.n_ctx, int(own.nbytes))
        self.governor: Governor = SpeedGovernor()  # kept across requests, as the drafting decision should be
        self._draft_stats = DraftStats()
        self.batch_governor: BatchGovernor | None = None
        self.scheduler: Scheduler | Batcher = (
            self._batcher(config.parallel) if config.parallel > 1 else Scheduler(f"cuca-model {self.source}"))
        weakref.finalize(self, self.scheduler.close)  # the worker exits once the model is gone

    def _batcher(self, n: int) -> Batcher:
        """`n` lanes, each with its own cache (and prompt cache) and its own drafter instance, one governor."""
        clock = PassClock()
        shared = self.batch_governor = BatchGovernor(clock, self.config.draft_tokens)
        lanes = []
        for i in range(n):
            lm = LaneModel(self.model)
            eng = Engine(lm, self.engine.n_ctx, self.config.prompt_cache)
            drafter = None
            if self.drafter is not None:
                fresh = getattr(self.drafter, "for_cache", None)
                if fresh is None:
                    raise ConfigError(f"drafter {type(self.drafter).__name__} cannot run on parallel lanes "
                                      "(no for_cache): use parallel=1")
                drafter = fresh(eng.cache)
            lanes.append((Lane(eng, drafter, shared.view(), i), lm))
        return Batcher(self.model, lanes, clock, f"cuca-model {self.source}")

    @property
    def _lane(self) -> Lane:
        """The scheduler's lane: the model's own engine, drafter and governor (as they are now)."""
        return Lane(self.engine, self.drafter, self.governor)

    @property
    def drafting(self) -> bool:
        """Whether the governor drafts now (for the batch size running now, when batching)."""
        if self.drafter is None:
            return False
        g = self.batch_governor if self.batch_governor is not None else self.governor
        return bool(getattr(g, "drafting", True))

    def _context_length(self, config: LocalModelConfig) -> int:
        """The context window: checked against the trained length and against the memory its cache needs."""
        n_train = int(self.model.n_ctx_train)
        n_ctx = config.context_length or min(4096, n_train)
        if n_ctx > n_train and not config.allow_long_context:
            raise ConfigError(
                f"context_length {n_ctx} exceeds the model's trained context length of {n_train} tokens; pass "
                "allow_long_context=True (--allow-long-context) to use it anyway"
            )
        self._check_memory(n_ctx)  # before the target's cache is made
        return n_ctx

    def _check_memory(self, n_ctx: int, drafter_bytes: int = 0) -> None:
        """The caches of the context window (the target's, plus `drafter_bytes` for a drafter's own: a draft
        model's, an MTP head's), one set per parallel slot, must fit in the memory available. Their arrays are
        untouched, so none is resident."""
        one, two = self.model.make_cache(1).nbytes, self.model.make_cache(2).nbytes
        n = self.config.parallel
        need = (one + (two - one) * (n_ctx - 1) + drafter_bytes) * n
        dev = self.model.ops.available_memory()  # a GPU's free memory, when the caches live there
        avail = available_memory() if dev is None else dev
        if avail is not None and need > avail:
            slots = f" for {n} parallel slots" if n > 1 else ""
            raise ConfigError(
                f"context_length {n_ctx} needs {need:,} bytes ({need / 2**30:.1f} GiB) of KV cache"
                f"{' (target and drafter)' if drafter_bytes else ''}{slots}, more than the {avail:,} bytes "
                f"({avail / 2**30:.1f} GiB) of memory available: lower context_length"
                f"{' or parallel' if n > 1 else ''}"
            )

    # ---- loading ----------------------------------------------------------------------------------------
    @classmethod
    async def load(cls, config: LocalModelConfig) -> LocalModel:
        return await asyncio.to_thread(cls, config)

    @classmethod
    def load_sync(cls, config: LocalModelConfig) -> LocalModel:
        return cls(config)

    def close(self) -> None:
        """Refuse new requests; the running one finishes, queued ones are cancelled."""
        self.scheduler.close()

    def __enter__(self) -> LocalModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- prompts ------------------------------------------------------------------------------------------
    def prompt_ids(self, prompt: str | Sequence[int], room: int = 1) -> list[int]:
        """Token ids of a text prompt, or a checked copy of a token-id prompt. A text that cannot fit in the
        context with `room` tokens to spare is refused before it is tokenized."""
        if isinstance(prompt, str):
            self._check_text_fits(prompt, room)
            return self.tokenizer.encode(prompt)
        return check_token_ids(prompt, self._n_vocab())

    def chat_prompt(self, messages: list[dict[str, Any]], room: int = 1) -> list[int]:
        tok = self.tokenizer
        text = tok.apply_chat_template(messages, add_generation_prompt=True)
        self._check_text_fits(text, room)
        # templates that write the BOS text themselves must not get a second BOS
        has_bos = tok.bos_id is not None and text.startswith(tok.id_to_token(tok.bos_id))
        return tok.encode(text, add_bos=False if has_bos else None)

    def _n_vocab(self) -> int:
        return min(int(self.model.n_vocab), self.tokenizer.vocab_size)

    def _check_text_fits(self, text: str, room: int) -> None:
        # no token covers more than max_token_bytes bytes, so this many non-space bytes need at least this many
        # tokens (spaces are left out: some tokenizers drop them after special tokens)
        n_ctx = self.engine.n_ctx
        longest = max(self.tokenizer.max_token_bytes, 1)
        if len(text) <= n_ctx:
            return
        dense = len(re.sub(r"\s+", "", text).encode("utf-8", "surrogatepass"))
        need = -(-dense // longest)
        if need + room > n_ctx:
            raise ContextLengthError(
                f"the prompt ({len(text):,} characters) needs at least {need:,} tokens; with max_tokens ({room}) "
                f"that exceeds the context length of {n_ctx}"
            )

    def draft_stats(self) -> DraftStats:
        """Rounds, drafted and accepted tokens summed over every request so far."""
        return DraftStats(self._draft_stats.rounds, self._draft_stats.drafted, self._draft_stats.accepted)

    def _speculation(self, lane: Lane) -> SpeculativeDecoder | None:
        if lane.drafter is None:
            return None
        return SpeculativeDecoder(lane.engine.model, lane.engine.cache, lane.drafter, lane.governor,
                                  self.config.draft_tokens)

    # ---- requests -----------------------------------------------------------------------------------------
    def _plan(self, prompt: Callable[[int], list[int]], kw: dict[str, Any]) -> _Plan:
        """Check a request's parameters in the caller's thread, before anything is queued."""
        a = check_request(kw)
        return _Plan(prompt, a.max_tokens, a.params, a.stop, a.gen, a.draft)

    def _text(self, prompt: str | Sequence[int]) -> Callable[[int], list[int]]:
        if isinstance(prompt, (bytes, bytearray, memoryview)):
            raise ConfigError("prompt: a bytes prompt is ambiguous: decode it to str for text, or pass a list of "
                              "token ids")
        if isinstance(prompt, str):
            return lambda room: self.prompt_ids(prompt, room)
        ids = check_token_ids(prompt, self._n_vocab())  # now: the caller may change its list afterwards
        return lambda room: ids

    def _chat(self, messages: list[dict[str, Any]]) -> Callable[[int], list[int]]:
        if not isinstance(messages, (list, tuple)):
            raise ConfigError(f"messages must be a list of {{'role': ..., 'content': ...}} dicts, got "
                              f"{type(messages).__name__}")
        msgs = [dict(m) if isinstance(m, dict) else m for m in messages]  # a snapshot, tokenized on the worker
        return lambda room: self.chat_prompt(msgs, room)

    def _job(self, plan: _Plan) -> _Job:
        return _Job(self, plan)

    def _serve(self, plan: _Plan, lane: Lane, ids: list[int]) -> Iterator[str | None]:
        """The worker's side of a request: text pieces, or None after a token that added none (the scheduler
        checks for cancellation at every item)."""
        spec = self._speculation(lane) if plan.draft else None
        plan.gen.draft = spec.stats if spec is not None else None
        try:
            yield from self._pieces(ids, plan, spec, lane.engine)
        finally:
            if spec is not None:
                self._draft_stats.add(spec.stats)

    def _pieces(self, ids: list[int], plan: _Plan, spec: SpeculativeDecoder | None,
                engine: Engine) -> Iterator[str | None]:
        dec, stop, gen = self.tokenizer.stream(skip_special=True), plan.stop, plan.gen
        pending = ""  # text held back while it could still be the start of a stop string
        hold = max((len(s) for s in stop), default=0)
        for tok in engine.stream(ids, plan.max_tokens, plan.params, self.tokenizer.eog_ids, gen, spec):
            if tok in self.tokenizer.eog_ids:
                break
            pending += dec.feed(tok)
            cut = _find_stop(pending, stop)
            if cut is not None:
                gen.finish_reason = "stop"
                if cut:
                    yield pending[:cut]
                return
            if len(pending) > hold:
                emit = len(pending) - hold
                yield pending[:emit]
                pending = pending[emit:]
            else:
                yield None
        pending += dec.flush()
        cut = _find_stop(pending, stop)
        if cut is not None:
            gen.finish_reason = "stop"
            pending = pending[:cut]
        if pending:
            yield pending

    def _stream(self, prompt: Callable[[int], list[int]], kw: dict[str, Any]) -> SyncStream:
        return SyncStream(self.scheduler, self._job(self._plan(prompt, kw)))

    def _astream(self, prompt: Callable[[int], list[int]], kw: dict[str, Any]) -> AsyncStream:
        return AsyncStream(self.scheduler, self._job(self._plan(prompt, kw)))

    def _reply(self, prompt: Callable[[int], list[int]], kw: dict[str, Any]) -> Reply:
        gen, kw = _with_gen(kw)
        with self._stream(prompt, kw) as s:
            return _as_reply("".join(s), gen)

    async def _areply(self, prompt: Callable[[int], list[int]], kw: dict[str, Any]) -> Reply:
        gen, kw = _with_gen(kw)
        s = self._astream(prompt, kw)
        try:
            return _as_reply("".join([p async for p in s]), gen)
        finally:
            s.close()

    # ---- synchronous requests (block the calling thread, never the model) ---------------------------------
    def stream_ids_sync(self, prompt_ids: Sequence[int], **kw: Any) -> Iterator[str]:
        """Stream text pieces for a tokenized prompt. Parameters: max_tokens (128), temperature (0.0: greedy),
        top_k (0: off), top_p (1.0: off), seed, stop (a string or strings), gen (a Generation that receives ids,
        finish reason and timings), draft (False decodes plainly even when the model has a drafter)."""
        return self._stream(self._text(prompt_ids), kw)

    def complete_sync(self, prompt: str | Sequence[int], **kw: Any) -> Reply:
        return self._reply(self._text(prompt), kw)

    def chat_sync(self, messages: list[dict[str, Any]], **kw: Any) -> Reply:
        return self._reply(self._chat(messages), kw)

    def stream_sync(self, prompt: str | Sequence[int], **kw: Any) -> Iterator[str]:
        return self._stream(self._text(prompt), kw)

    def stream_chat_sync(self, messages: list[dict[str, Any]], **kw: Any) -> Iterator[str]:
        return self._stream(self._chat(messages), kw)

    # ---- asynchronous requests (await the scheduler's channel; no thread pool) -----------------------------
    async def complete(self, prompt: str | Sequence[int], **kw: Any) -> Reply:
        return await self._areply(self._text(prompt), kw)

    async def chat(self, messages: list[dict[str, Any]], **kw: Any) -> Reply:
        return await self._areply(self._chat(messages), kw)

    def stream(self, prompt: str | Sequence[int], **kw: Any) -> AsyncIterator[str]:
        return self._astream(self._text(prompt), kw)

    def stream_chat(self, messages: list[dict[str, Any]], **kw: Any) -> AsyncIterator[str]:
        return self._astream(self._chat(messages), kw)


class _Job:
    """A request as its worker runs it: called bare (the scheduler: the model's own lane) or with a batcher's lane;
    `affinity(lane)` scores a lane by the prompt rows its cache keeps. The prompt is tokenized once, on the worker."""

    def __init__(self, model: LocalModel, plan: _Plan):
        self.model, self.plan = model, plan
        self._ids: list[int] | None = None

    def ids(self) -> list[int]:
        if self._ids is None:
            self._ids = self.plan.prompt(self.plan.max_tokens)
        return self._ids

    def affinity(self, lane: Lane) -> int:
        pc = lane.engine.prompt_cache
        return max((rows for rows, _ in pc.candidates(self.ids())), default=0) if pc is not None else 0

    def __call__(self, lane: Lane | None = None) -> Iterator[str | None]:
        return self.model._serve(self.plan, lane if lane is not None else self.model._lane, self.ids())


def _with_gen(kw: dict[str, Any]) -> tuple[Generation, dict[str, Any]]:
    """The request's Generation (the caller's, or a new one) and the parameters that carry it."""
    gen = kw.get("gen")
    if gen is None:
        gen = Generation()
    return gen, {**kw, "gen": gen}  # anything but a Generation is refused by check_request


def _as_reply(text: str, gen: Generation) -> Reply:
    return Reply(text, gen.tokens, gen.finish_reason or "length", gen.timings, gen.draft)


def _ops(config: LocalModelConfig) -> Ops:
    """The backend of the config's device: the C kernels, or the PyTorch backend (cuca.gpu)."""
    device, index = Device.locate(config.device)
    if device is Device.CPU:
        return Ops(config.threads or (os.cpu_count() or 1))
    from .gpu import make_ops

    ops = make_ops(device, index, config.threads)
    ops.pass_rows = config.draft_tokens + 1  # passes of up to this many rows are captured (a round's verify pass)
    return ops


def available_memory() -> int | None:
    """Bytes of memory available now (Linux MemAvailable, else free pages), or None when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _find_stop(text: str, stop: Sequence[str]) -> int | None:
    """Index where the earliest stop string starts in text, or None."""
    hits = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    return min(hits) if hits else None
