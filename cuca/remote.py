"""RemoteModel: LocalModel's request methods against any OpenAI-compatible server (cuca serve, vLLM, SGLang,
llama-server), through the official `openai` client. Moving from one machine to a serving engine is a change of
constructor, not of code."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from .errors import ConfigError, ContextLengthError, CucaError, ProviderError
from .local import Reply
from .request import check_request
from .sampling import is_int
from .speculative.governor import GovernorEvent
from .speculative.stats import DraftStats, RequestDraftStats


def _openai() -> Any:
    try:
        import openai
    except ImportError:
        raise CucaError("RemoteModel needs the openai package: pip install openai (or cuca[serve])") from None
    return openai


def _error(e: Exception, base_url: str) -> CucaError:
    """An openai client error as the CucaError a LocalModel would raise for the same cause."""
    openai = _openai()
    if isinstance(e, openai.APIStatusError):
        body = e.body if isinstance(e.body, dict) else {}
        err = body.get("error", body) if isinstance(body.get("error", body), dict) else {}
        msg = f"{base_url}: HTTP {e.status_code}: {err.get('message') or e.message}"
        if err.get("code") == "context_length_exceeded":
            return ContextLengthError(msg)
        return ConfigError(msg) if e.status_code in (400, 413, 422) else ProviderError(msg)
    return ProviderError(f"{base_url}: {type(e).__name__}: {e}")


class _Request:
    """One checked request: the body fields to send and the Generation that receives the outcome."""

    def __init__(self, kw: dict[str, Any]):
        a = check_request(kw)
        p, self.gen, stop, max_tokens = a.params, a.gen, list(a.stop), a.max_tokens
        self.args: dict[str, Any] = {"max_tokens": int(max_tokens), "temperature": p.temperature, "top_p": p.top_p}
        if stop:
            self.args["stop"] = stop
        if p.seed is not None:
            self.args["seed"] = p.seed
        extra: dict[str, Any] = {}
        if p.top_k:
            extra["top_k"] = p.top_k  # an extension that cuca serve, vLLM and llama-server read
        if not a.draft:
            extra["draft"] = False  # cuca serve's extension; other servers ignore it
        if extra:
            self.args["extra_body"] = extra
        self.text: list[str] = []

    def finish(self, obj: Any, finish_reason: str | None) -> None:
        """Fill the Generation from a reply (or the stream's closing chunks): usage, timings, cuca's extension."""
        gen, t = self.gen, self.gen.timings
        extra = dict(getattr(obj, "model_extra", None) or {})
        cuca, timings = extra.get("cuca"), extra.get("timings")
        if finish_reason is not None:
            gen.finish_reason = "stop" if finish_reason == "stop" else "length"
        if isinstance(cuca, dict):
            gen.tokens = [int(x) for x in cuca.get("tokens") or []]
            gen.draft = _draft(cuca.get("draft"))
        if isinstance(timings, dict):
            t.prompt_s = float(timings.get("prompt_ms") or 0.0) / 1e3
            t.decode_s = float(timings.get("predicted_ms") or 0.0) / 1e3
            if gen.draft is None and timings.get("draft_n"):
                gen.draft = RequestDraftStats(drafted=int(timings["draft_n"]),
                                              accepted=int(timings.get("draft_n_accepted") or 0))
        u = getattr(obj, "usage", None)
        if u is not None:
            t.n_prompt, t.n_generated = int(u.prompt_tokens or 0), int(u.completion_tokens or 0)
            details = getattr(u, "prompt_tokens_details", None)
            t.n_cached = int(getattr(details, "cached_tokens", 0) or 0)

    def reply(self) -> Reply:
        g = self.gen
        return Reply("".join(self.text), g.tokens, g.finish_reason or "length", g.timings, g.draft)


def _draft(d: Any) -> RequestDraftStats | None:
    """A server's drafting statistics (cuca serve's extension field); None where absent or malformed."""
    if not isinstance(d, dict):
        return None
    try:
        return _parse_draft(d)
    except (TypeError, ValueError, IndexError):
        return None


def _parse_draft(d: dict[str, Any]) -> RequestDraftStats:
    events = [GovernorEvent(str(e[0]), int(e[1]), int(e[2]) if len(e) > 2 else 0)
              for e in d.get("governor_events") or [] if isinstance(e, (list, tuple)) and len(e) >= 2]
    return RequestDraftStats(rounds=int(d.get("rounds", 0)), drafted=int(d.get("drafted", 0)),
                             accepted=int(d.get("accepted", 0)),
                             accepted_per_position=[int(x) for x in d.get("accepted_per_position") or []],
                             drafted_per_position=[int(x) for x in d.get("drafted_per_position") or []],
                             rounds_per_depth=[int(x) for x in d.get("rounds_per_depth") or []],
                             governor_events=events)


class RemoteModel:
    """A model served by an OpenAI-compatible server at `base_url` (e.g. http://127.0.0.1:8080/v1) under the name
    `model`. The same request methods, parameters and Reply as LocalModel; the server decides the rest."""

    def __init__(self, base_url: str, model: str, api_key: str | None = None, timeout: float = 600.0):
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"base_url must be an http(s) URL, got {base_url!r}")
        if not isinstance(model, str) or not model:
            raise ConfigError(f"model must be the served model's name, got {model!r}")
        self.base_url, self.model = base_url.rstrip("/"), model
        self._key = api_key or "none"  # the client insists on a key; servers without one ignore it
        self._timeout = timeout
        self._sync = _openai().OpenAI(base_url=self.base_url, api_key=self._key, timeout=timeout, max_retries=0)
        self._draft_stats = DraftStats()

    def close(self) -> None:
        self._sync.close()

    def __enter__(self) -> RemoteModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def draft_stats(self) -> DraftStats:
        """Rounds, drafted and accepted tokens the server reported, summed over this object's requests (zero where
        a server reports none; llama-server reports no rounds)."""
        return DraftStats(self._draft_stats.rounds, self._draft_stats.drafted, self._draft_stats.accepted)

    def _count(self, r: _Request) -> None:
        if r.gen.draft is not None:
            self._draft_stats.add(r.gen.draft)

    def _client(self) -> Any:
        return _openai().AsyncOpenAI(base_url=self.base_url, api_key=self._key, timeout=self._timeout,
                                     max_retries=0)

    # ---- the wire ------------------------------------------------------------------------------------------
    @staticmethod
    def _body(chat: bool, what: Any) -> dict[str, Any]:
        if chat:
            if not isinstance(what, (list, tuple)):
                raise ConfigError(f"messages must be a list of {{'role': ..., 'content': ...}} dicts, got "
                                  f"{type(what).__name__}")
            return {"messages": [dict(m) if isinstance(m, dict) else m for m in what]}
        if isinstance(what, (bytes, bytearray, memoryview)):
            raise ConfigError("prompt: a bytes prompt is ambiguous: decode it to str for text, or pass a list of "
                              "token ids")
        if not isinstance(what, str):
            what = list(what)
            if not all(is_int(t) and t >= 0 for t in what):
                raise ConfigError("prompt: a token-id prompt must be a sequence of non-negative integers")
            what = [int(t) for t in what]
        return {"prompt": what}

    def _call(self, client: Any, chat: bool, body: dict[str, Any], stream: bool) -> Any:
        api = client.chat.completions if chat else client.completions
        extra = {"stream_options": {"include_usage": True}} if stream else {}
        return api.create(model=self.model, stream=stream, **body, **extra)

    @staticmethod
    def _piece(chat: bool, choice: Any) -> str:
        return (choice.delta.content or "") if chat else (choice.text or "")

    def _reply_sync(self, chat: bool, what: Any, kw: dict[str, Any]) -> Reply:
        r = _Request(kw)
        try:
            resp = self._call(self._sync, chat, {**self._body(chat, what), **r.args}, False)
        except _openai().OpenAIError as e:
            raise _error(e, self.base_url) from None
        return self._whole(chat, resp, r)

    def _whole(self, chat: bool, resp: Any, r: _Request) -> Reply:
        """A whole (not streamed) reply: its text, finish reason and usage."""
        if not getattr(resp, "choices", None):
            raise ProviderError(f"{self.base_url}: the server's reply has no choices")
        choice = resp.choices[0]
        r.text.append((choice.message.content or "") if chat else (choice.text or ""))
        r.finish(resp, choice.finish_reason)
        self._count(r)
        return r.reply()

    def _stream_sync(self, chat: bool, what: Any, kw: dict[str, Any]) -> Iterator[str]:
        r = _Request(kw)  # checked now, as LocalModel checks a request before its first item
        return self._iter_sync(chat, {**self._body(chat, what), **r.args}, r)

    def _take(self, chat: bool, c: Any, r: _Request) -> Iterator[str]:
        """One streamed chunk: its text pieces; its finish reason and usage go to the request."""
        for choice in c.choices:
            piece = self._piece(chat, choice)
            if piece:
                yield piece
            if choice.finish_reason is not None:
                r.finish(c, choice.finish_reason)
        if not c.choices:
            r.finish(c, None)

    def _iter_sync(self, chat: bool, body: dict[str, Any], r: _Request) -> Iterator[str]:
        try:
            with self._call(self._sync, chat, body, True) as chunks:
                for c in chunks:
                    yield from self._take(chat, c, r)
        except _openai().OpenAIError as e:
            raise _error(e, self.base_url) from None
        self._count(r)

    async def _reply(self, chat: bool, what: Any, kw: dict[str, Any]) -> Reply:
        r = _Request(kw)
        body = {**self._body(chat, what), **r.args}
        try:
            async with self._client() as client:
                resp = await self._call(client, chat, body, False)
        except _openai().OpenAIError as e:
            raise _error(e, self.base_url) from None
        return self._whole(chat, resp, r)

    def _stream(self, chat: bool, what: Any, kw: dict[str, Any]) -> AsyncIterator[str]:
        r = _Request(kw)
        return self._iter(chat, {**self._body(chat, what), **r.args}, r)

    async def _iter(self, chat: bool, body: dict[str, Any], r: _Request) -> AsyncIterator[str]:
        try:
            async with self._client() as client:
                chunks = await self._call(client, chat, body, True)
                async with chunks:
                    async for c in chunks:
                        for piece in self._take(chat, c, r):
                            yield piece
        except _openai().OpenAIError as e:
            raise _error(e, self.base_url) from None
        self._count(r)

    # ---- LocalModel's request methods ------------------------------------------------------------------------
    def complete_sync(self, prompt: str | Sequence[int], **kw: Any) -> Reply:
        return self._reply_sync(False, prompt, kw)

    def chat_sync(self, messages: list[dict[str, Any]], **kw: Any) -> Reply:
        return self._reply_sync(True, messages, kw)

    def stream_sync(self, prompt: str | Sequence[int], **kw: Any) -> Iterator[str]:
        return self._stream_sync(False, prompt, kw)

    def stream_chat_sync(self, messages: list[dict[str, Any]], **kw: Any) -> Iterator[str]:
        return self._stream_sync(True, messages, kw)

    async def complete(self, prompt: str | Sequence[int], **kw: Any) -> Reply:
        return await self._reply(False, prompt, kw)

    async def chat(self, messages: list[dict[str, Any]], **kw: Any) -> Reply:
        return await self._reply(True, messages, kw)

    def stream(self, prompt: str | Sequence[int], **kw: Any) -> AsyncIterator[str]:
        return self._stream(False, prompt, kw)

    def stream_chat(self, messages: list[dict[str, Any]], **kw: Any) -> AsyncIterator[str]:
        return self._stream(True, messages, kw)
