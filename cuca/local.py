"""LocalModel: load a GGUF model in-process and serve completion and chat requests, one at a time."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .device import Device
from .engine import Engine, Generation, Timings
from .errors import ConfigError
from .gguf import open_gguf
from .models import load_model
from .models.layers import Ops
from .sampling import SamplingParams
from .sources import ModelSource
from .speculative.decoder import SpeculativeDecoder
from .speculative.drafters import Drafter
from .speculative.drafters.load import check_device, load_drafter
from .speculative.governor import Governor, SpeedGovernor
from .speculative.source import DrafterSource
from .speculative.stats import DraftStats, RequestDraftStats
from .tokenizer import Tokenizer


@dataclass(frozen=True)
class LocalModelConfig:
    """What to load and how. Drafting is off unless `drafter` is set (a DrafterSource, or a ModelSource / string
    naming a drafter file); `threads` 0 uses every core; `context_length` 0 uses min(4096, trained length);
    `device` a Device or its name (only "cpu" in this build)."""

    source: ModelSource | str | os.PathLike[str] = "gemma3-270m-q4_k_m"
    drafter: DrafterSource | ModelSource | str | None = None
    draft_tokens: int = 3
    context_length: int = 0
    threads: int = 0
    device: Device | str = Device.CPU

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
        if not _is_int(self.context_length) or self.context_length < 0:
            raise ConfigError(f"context_length must be an integer >= 0, got {self.context_length!r}")
        if not _is_int(self.threads) or self.threads < 0:
            raise ConfigError(f"threads must be an integer >= 0, got {self.threads!r}")
        if not _is_int(self.draft_tokens) or (self.drafter is not None and self.draft_tokens < 1):
            raise ConfigError(f"draft_tokens must be an integer >= 1 when a drafter is set, got {self.draft_tokens!r}")
        device = Device.parse(self.device)
        if self.drafter is not None:
            check_device(DrafterSource.parse(self.drafter), device)
        device.check_available()


@dataclass
class Reply:
    """A finished request: generated text and ids, why it stopped, and how long it took."""

    text: str
    tokens: list[int]
    finish_reason: str
    timings: Timings = field(default_factory=Timings)
    draft: RequestDraftStats | None = None


class LocalModel:
    """A loaded model. Requests are served one at a time, in order (a lock guards the engine)."""

    def __init__(self, config: LocalModelConfig):
        config.validate()
        self.config = config
        self.source = ModelSource.parse(config.source)
        self.path = self.source.resolve()
        self.file = open_gguf(self.path)
        self.tokenizer = Tokenizer.from_gguf(self.file)
        self.model = load_model(self.file, Ops(config.threads or (os.cpu_count() or 1)))
        n_ctx = config.context_length or min(4096, int(self.model.n_ctx_train))
        self.engine = Engine(self.model, n_ctx)
        self.drafter_source = DrafterSource.parse(config.drafter) if config.drafter is not None else None
        self.drafter: Drafter | None = None
        if self.drafter_source is not None:
            self.drafter = load_drafter(self.drafter_source, self.model, self.engine.cache, self.model.ops, self.path)
        self.governor: Governor = SpeedGovernor()  # kept across requests, as the drafting decision should be
        self._draft_stats = DraftStats()
        self._lock = threading.Lock()

    # ---- loading ----------------------------------------------------------------------------------------
    @classmethod
    async def load(cls, config: LocalModelConfig) -> LocalModel:
        return await asyncio.to_thread(cls, config)

    @classmethod
    def load_sync(cls, config: LocalModelConfig) -> LocalModel:
        return cls(config)

    # ---- synchronous requests ---------------------------------------------------------------------------
    def prompt_ids(self, prompt: str | Sequence[int]) -> list[int]:
        return list(prompt) if not isinstance(prompt, str) else self.tokenizer.encode(prompt)

    def chat_prompt(self, messages: list[dict[str, Any]]) -> list[int]:
        tok = self.tokenizer
        text = tok.apply_chat_template(messages, add_generation_prompt=True)
        # templates that write the BOS text themselves must not get a second BOS
        has_bos = tok.bos_id is not None and text.startswith(tok.id_to_token(tok.bos_id))
        return tok.encode(text, add_bos=False if has_bos else None)

    def draft_stats(self) -> DraftStats:
        """Rounds, drafted and accepted tokens summed over every request so far."""
        return DraftStats(self._draft_stats.rounds, self._draft_stats.drafted, self._draft_stats.accepted)

    def _speculation(self) -> SpeculativeDecoder | None:
        if self.drafter is None:
            return None
        return SpeculativeDecoder(self.model, self.engine.cache, self.drafter, self.governor, self.config.draft_tokens)

    def stream_ids_sync(
        self,
        prompt_ids: list[int],
        max_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: str | Sequence[str] = (),
        gen: Generation | None = None,
        draft: bool = True,
    ) -> Iterator[str]:
        """Stream text pieces for a tokenized prompt; `gen` receives ids, finish reason and timings. `draft=False`
        decodes this request plainly even when the model has a drafter (to measure what drafting gains)."""
        if not _is_int(max_tokens) or max_tokens < 1:
            raise ConfigError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
        params = SamplingParams(temperature, top_k, top_p, seed)
        stop = _stop_strings(stop)
        gen = gen if gen is not None else Generation()
        spec = self._speculation() if draft else None
        gen.draft = spec.stats if spec is not None else None
        with self._lock:
            try:
                yield from self._stream_locked(prompt_ids, max_tokens, params, stop, gen, spec)
            finally:
                if spec is not None:
                    self._draft_stats.add(spec.stats)

    def _stream_locked(
        self, prompt_ids: list[int], max_tokens: int, params: SamplingParams, stop: Sequence[str],
        gen: Generation, spec: SpeculativeDecoder | None,
    ) -> Iterator[str]:
        dec = self.tokenizer.stream(skip_special=True)
        pending = ""  # text held back while it could still be the start of a stop string
        hold = max((len(s) for s in stop), default=0)
        for tok in self.engine.stream(prompt_ids, max_tokens, params, self.tokenizer.eog_ids, gen, spec):
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
        pending += dec.flush()
        cut = _find_stop(pending, stop)
        if cut is not None:
            gen.finish_reason = "stop"
            pending = pending[:cut]
        if pending:
            yield pending

    def complete_sync(self, prompt: str | Sequence[int], **kw: Any) -> Reply:
        gen = Generation()
        text = "".join(self.stream_ids_sync(self.prompt_ids(prompt), gen=gen, **kw))
        return Reply(text, gen.tokens, gen.finish_reason or "length", gen.timings, gen.draft)

    def chat_sync(self, messages: list[dict[str, Any]], **kw: Any) -> Reply:
        gen = Generation()
        text = "".join(self.stream_ids_sync(self.chat_prompt(messages), gen=gen, **kw))
        return Reply(text, gen.tokens, gen.finish_reason or "length", gen.timings, gen.draft)

    def stream_sync(self, prompt: str | Sequence[int], **kw: Any) -> Iterator[str]:
        return self.stream_ids_sync(self.prompt_ids(prompt), **kw)

    def stream_chat_sync(self, messages: list[dict[str, Any]], **kw: Any) -> Iterator[str]:
        return self.stream_ids_sync(self.chat_prompt(messages), **kw)

    # ---- asynchronous requests (run in a worker thread; the lock keeps them in order) --------------------
    async def complete(self, prompt: str | Sequence[int], **kw: Any) -> Reply:
        return await asyncio.to_thread(self.complete_sync, prompt, **kw)

    async def chat(self, messages: list[dict[str, Any]], **kw: Any) -> Reply:
        return await asyncio.to_thread(self.chat_sync, messages, **kw)

    async def stream(self, prompt: str | Sequence[int], **kw: Any) -> AsyncIterator[str]:
        async for piece in _in_thread(self.stream_sync(prompt, **kw)):
            yield piece

    async def stream_chat(self, messages: list[dict[str, Any]], **kw: Any) -> AsyncIterator[str]:
        async for piece in _in_thread(self.stream_chat_sync(messages, **kw)):
            yield piece


async def _in_thread(it: Iterator[str]) -> AsyncIterator[str]:
    """A sync iterator's items, each computed in a worker thread (the model's lock keeps requests in order)."""
    done = object()
    while True:
        piece = await asyncio.to_thread(next, it, done)
        if piece is done:
            return
        yield piece  # type: ignore[misc]


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _stop_strings(stop: str | Sequence[str] | None) -> tuple[str, ...]:
    """`stop` as a tuple of strings: one string is one stop string (not its characters)."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if not all(isinstance(s, str) for s in stop):
        raise ConfigError(f"stop must be a string or a list of strings, got {stop!r}")
    return tuple(stop)


def _find_stop(text: str, stop: Sequence[str]) -> int | None:
    """Index where the earliest stop string starts in text, or None."""
    hits = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    return min(hits) if hits else None
