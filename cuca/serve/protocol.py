"""OpenAI's request and response shapes for `cuca serve`: a request body checked field by field into a `Job` (what
LocalModel runs), replies and stream chunks built from a finished (or running) Generation, errors as OpenAI's
error JSON. No I/O here: the app does the HTTP."""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..engine import Generation
from ..errors import ConfigError, ContextLengthError, CucaError, TokenizerError

MAX_BODY_BYTES = 4 << 20  # a request body; a prompt past the context is refused anyway
MAX_MESSAGES = 4096
MAX_STOP = 16  # stop strings per request (OpenAI allows 4)
MAX_STOP_CHARS = 1024
ROLES = ("system", "developer", "user", "assistant", "tool")
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False, 0), "top_logprobs": (None, 0), "echo": (None, False), "best_of": (None, 1),
    "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0), "logit_bias": (None, {}),
    "tools": (None, []), "suffix": (None, ""),
}


class APIError(Exception):
    """An error reply: HTTP status, OpenAI's error type, message, offending parameter and code."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type_

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def from_cuca(e: CucaError, param: str | None = None) -> APIError:
    """A CucaError raised by a request as a 400 (a context overflow keeps OpenAI's code); a closed model is 503."""
    if isinstance(e, ContextLengthError):
        return APIError(400, str(e), param or "messages", "context_length_exceeded")
    if isinstance(e, (ConfigError, TokenizerError)):
        return APIError(400, str(e), param)
    if "closed" in str(e):
        return APIError(503, str(e), None, "model_closed", "server_error")
    return APIError(400, str(e), param)


@dataclass
class Job:
    """A checked request: `prompt` (text or ids) or `messages`, LocalModel's keyword arguments, and the reply's
    form."""

    chat: bool
    model: str
    kw: dict[str, Any]
    prompt: str | list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    stream: bool = False
    include_usage: bool = False
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))


def parse_body(raw: bytes) -> dict[str, Any]:
    if len(raw) > MAX_BODY_BYTES:
        raise APIError(413, f"the request body is {len(raw):,} bytes; the limit is {MAX_BODY_BYTES:,}")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}"[:300]) from None
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def _int(body: dict[str, Any], key: str, lo: int, default: int | None) -> int | None:
    v = body.get(key)
    if v is None:
        return default
    if type(v) is not int or v < lo:
        raise APIError(400, f"{key} must be an integer >= {lo}, got {v!r}", key)
    return v


def _num(body: dict[str, Any], key: str, lo: float, hi: float, default: float) -> float:
    v = body.get(key)
    if v is None:
        return default
    if type(v) not in (int, float) or not math.isfinite(v) or not lo <= v <= hi:
        raise APIError(400, f"{key} must be a number in [{lo}, {hi}], got {v!r}", key)
    return float(v)


def _stop(v: Any) -> list[str]:
    if v is None:
        return []
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise APIError(400, "stop must be a string or a list of strings", "stop")
    if len(items) > MAX_STOP or any(len(s) > MAX_STOP_CHARS for s in items):
        raise APIError(400, f"stop: at most {MAX_STOP} strings of at most {MAX_STOP_CHARS} characters", "stop")
    return [s for s in items if s]


def _common(body: dict[str, Any], chat: bool, n_ctx: int) -> tuple[dict[str, Any], bool, bool]:
    for key, allowed in UNSUPPORTED.items():
        if key in body and body[key] not in allowed:
            raise APIError(400, f"{key} is not supported by cuca serve", key)
    if _int(body, "n", 1, 1) != 1:
        raise APIError(400, "n must be 1 (one choice per request)", "n")
    keys = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",)
    max_tokens = None
    for key in keys:
        max_tokens = max_tokens or _int(body, key, 1, None)
    if max_tokens is not None and max_tokens > n_ctx:
        raise APIError(400, f"{keys[-1]} ({max_tokens}) exceeds the context length of {n_ctx}", keys[-1],
                       "context_length_exceeded")
    kw: dict[str, Any] = {
        "max_tokens": max_tokens if max_tokens is not None else (256 if chat else 16),
        "temperature": _num(body, "temperature", 0.0, 2.0, 1.0),
        "top_p": _num(body, "top_p", 1e-9, 1.0, 1.0),
        "top_k": _int(body, "top_k", 0, 0),
        "stop": _stop(body.get("stop")),
    }
    draft = body.get("draft", True)  # extension: false decodes plainly even when the server has a drafter
    if not isinstance(draft, bool):
        raise APIError(400, f"draft must be true or false, got {draft!r}", "draft")
    kw["draft"] = draft
    seed = body.get("seed")
    if seed is not None:
        if type(seed) is not int:
            raise APIError(400, f"seed must be an integer, got {seed!r}", "seed")
        kw["seed"] = seed % (1 << 63)  # OpenAI allows negative seeds; numpy wants them >= 0
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise APIError(400, f"stream must be true or false, got {stream!r}", "stream")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise APIError(400, "stream_options must be an object", "stream_options")
    usage = (opts or {}).get("include_usage", False)
    if not isinstance(usage, bool):
        raise APIError(400, "stream_options.include_usage must be true or false", "stream_options")
    return kw, stream, usage


def _model(body: dict[str, Any], names: tuple[str, ...]) -> str:
    name = body.get("model")
    if not isinstance(name, str):
        raise APIError(400, "model is required (a string; GET /v1/models lists them)", "model")
    if name not in names:
        raise APIError(404, f"the model {name!r} does not exist (served: {', '.join(names)})", "model",
                       "model_not_found")
    return name


def completion_job(body: dict[str, Any], names: tuple[str, ...], n_ctx: int) -> Job:
    name = _model(body, names)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list):
        if len(prompt) > n_ctx or not all(type(t) is int for t in prompt):
            raise APIError(400, f"prompt: a list of at most {n_ctx} token ids (integers), or a string", "prompt")
    elif not isinstance(prompt, str):
        raise APIError(400, "prompt must be a string or a list of token ids (one prompt per request)", "prompt")
    kw, stream, usage = _common(body, False, n_ctx)
    return Job(False, name, kw, prompt=prompt, stream=stream, include_usage=usage)


def _content(i: int, m: Any) -> dict[str, Any]:
    if not isinstance(m, dict):
        raise APIError(400, f"messages[{i}] must be an object with role and content", f"messages[{i}]")
    role, content = m.get("role"), m.get("content")
    if role not in ROLES:
        raise APIError(400, f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}",
                       f"messages[{i}].role")
    if content is None and role == "assistant":
        content = ""
    if isinstance(content, list):  # content parts: only text
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise APIError(400, f"messages[{i}].content: only text parts are supported", f"messages[{i}].content")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise APIError(400, f"messages[{i}].content must be a string or a list of text parts",
                       f"messages[{i}].content")
    return {"role": role, "content": content}


def chat_job(body: dict[str, Any], names: tuple[str, ...], n_ctx: int) -> Job:
    name = _model(body, names)
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not 1 <= len(msgs) <= MAX_MESSAGES:
        raise APIError(400, f"messages must be a list of 1 to {MAX_MESSAGES} messages", "messages")
    messages = [_content(i, m) for i, m in enumerate(msgs)]
    kw, stream, usage = _common(body, True, n_ctx)
    return Job(True, name, kw, messages=messages, stream=stream, include_usage=usage)


# ---- replies -------------------------------------------------------------------------------------------------------
def usage(gen: Generation) -> dict[str, Any]:
    t = gen.timings
    return {"prompt_tokens": t.n_prompt, "completion_tokens": len(gen.tokens),
            "total_tokens": t.n_prompt + len(gen.tokens), "prompt_tokens_details": {"cached_tokens": t.n_cached}}


def timings(gen: Generation) -> dict[str, Any]:
    """llama-server's `timings` names: prompt (prefilled rows only, cache_n the kept ones), prediction, drafts."""
    t, d = gen.timings, gen.draft
    prompt_ms, predicted_ms = t.prompt_s * 1e3, t.decode_s * 1e3  # the prefill pass yields the first token
    n = len(gen.tokens)
    return {
        "cache_n": t.n_cached, "prompt_n": t.n_prefilled, "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / t.n_prefilled if t.n_prefilled else 0.0,
        "prompt_per_second": t.n_prefilled / t.prompt_s if t.prompt_s > 0 else 0.0,
        "predicted_n": n, "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / (n - 1) if n > 1 else 0.0,
        "predicted_per_second": t.tokens_per_second,
        "draft_n": d.drafted if d is not None else 0, "draft_n_accepted": d.accepted if d is not None else 0,
    }


def extension(gen: Generation) -> dict[str, Any]:
    """cuca's own per-request statistics: drafting (rounds, drafted, accepted, per position, governor events), the
    prompt cache's reuse in rows, the generated token ids."""
    t = gen.timings
    return {"draft": gen.draft.to_dict() if gen.draft is not None else None, "prompt_tokens": t.n_prompt,
            "prefilled_tokens": t.n_prefilled, "cached_tokens": t.n_cached, "tokens": list(gen.tokens)}


def _head(job: Job, obj: str) -> dict[str, Any]:
    kind = "chatcmpl" if job.chat else "cmpl"
    return {"id": f"{kind}-{job.id}", "object": obj, "created": job.created, "model": job.model}


def reply(job: Job, text: str, gen: Generation) -> dict[str, Any]:
    finish = gen.finish_reason or "length"
    if job.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return {**_head(job, "chat.completion" if job.chat else "text_completion"), "choices": [choice],
            "usage": usage(gen), "timings": timings(gen), "cuca": extension(gen)}


def chunk(job: Job, piece: str | None, finish: str | None = None, role: bool = False) -> dict[str, Any]:
    """One stream chunk: a text piece, the opening role delta (chat), or the closing one with finish_reason."""
    if job.chat:
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else ({} if piece is None else
                                                                                    {"content": piece})
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": piece or "", "logprobs": None, "finish_reason": finish}
    out = {**_head(job, "chat.completion.chunk" if job.chat else "text_completion"), "choices": [choice]}
    if job.include_usage:
        out["usage"] = None
    return out


def last_chunks(job: Job, gen: Generation) -> list[dict[str, Any]]:
    """The closing chunk (finish_reason, timings, cuca's statistics) and, when asked for, the usage chunk."""
    end = {**chunk(job, None, gen.finish_reason or "length"), "timings": timings(gen), "cuca": extension(gen)}
    out = [end]
    if job.include_usage:
        out.append({**_head(job, "chat.completion.chunk" if job.chat else "text_completion"), "choices": [],
                    "usage": usage(gen)})
    return out
