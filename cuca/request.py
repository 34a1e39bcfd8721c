"""A request's parameters, checked in the caller's thread before anything is queued or sent: the same checks for
LocalModel and RemoteModel, so a bad parameter is the same ConfigError on either."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .engine import Generation
from .errors import ConfigError
from .sampling import SamplingParams, is_int

REQUEST_KEYS = ("max_tokens", "temperature", "top_k", "top_p", "seed", "stop", "gen", "draft")


@dataclass(frozen=True)
class RequestArgs:
    """max_tokens (128), sampling params (temperature 0.0: greedy, top_k 0 and top_p 1.0: off, seed), stop strings,
    the Generation that receives the outcome, and whether a model with a drafter drafts (True)."""

    max_tokens: int
    params: SamplingParams
    stop: tuple[str, ...]
    gen: Generation
    draft: bool


def check_request(kw: dict[str, Any]) -> RequestArgs:
    unknown = sorted(set(kw) - set(REQUEST_KEYS))
    if unknown:
        raise ConfigError(f"unknown request parameter(s) {', '.join(unknown)} (known: {', '.join(REQUEST_KEYS)})")
    max_tokens = kw.get("max_tokens", 128)
    if not is_int(max_tokens) or max_tokens < 1:
        raise ConfigError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
    params = SamplingParams(kw.get("temperature", 0.0), kw.get("top_k", 0), kw.get("top_p", 1.0), kw.get("seed"))
    gen = kw.get("gen")
    if gen is not None and not isinstance(gen, Generation):
        raise ConfigError(f"gen must be a Generation or None, got {type(gen).__name__}")
    return RequestArgs(int(max_tokens), params, stop_strings(kw.get("stop", ())),
                       gen if gen is not None else Generation(), bool(kw.get("draft", True)))


def stop_strings(stop: str | Iterable[str] | None) -> tuple[str, ...]:
    """`stop` as a tuple of strings: one string is one stop string (not its characters); any iterable of strings
    (a list, a generator) is read once."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    try:
        items = tuple(stop) if not isinstance(stop, (bytes, bytearray)) else None
    except TypeError:
        items = None
    if items is None or not all(isinstance(s, str) for s in items):
        raise ConfigError(f"stop must be a string or an iterable of strings, got {stop!r}")
    return items
