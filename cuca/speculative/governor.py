"""The governor: draft only while drafting is measurably faster than plain decoding.

It keeps one exponential moving average of tokens per second for plain rounds and one for speculative rounds (a
round's rate is the tokens it emitted over its duration), and runs this schedule:
  * measure plain first (WARMUP_ROUNDS plain rounds), then speculative (WARMUP_ROUNDS speculative rounds);
  * draft while spec >= SPEEDUP * plain, checked after every round; after every REFRESH_EVERY speculative rounds,
    refresh the plain estimate with REFRESH_ROUNDS plain rounds;
  * while plain is faster, re-probe with PROBE_ROUNDS speculative rounds after `interval` plain rounds; the
    interval starts at PROBE_FIRST, doubles after each failed probe up to PROBE_MAX, and a successful probe resets it.
A refresh or a probe restarts its average, so two fresh rounds decide instead of an estimate gone stale over tens
of rounds. A request with a fixed seed and temperature > 0 drafts every round (`force`) so that equal prompts
reproduce equal tokens; its rounds still feed the averages but do not advance the schedule. The state lives as
long as the Governor, one per model, across requests.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

ALPHA = 0.1  # weight of the newest round: ~10 rounds of memory, smoothing the 1..n+1 tokens a spec round emits
WARMUP_ROUNDS = 2
SPEEDUP = 1.02
REFRESH_EVERY = 64
REFRESH_ROUNDS = 2
PROBE_FIRST = 32
PROBE_ROUNDS = 2
PROBE_MAX = 512
EVENTS_KEPT = 4096  # the log is bounded: a model may serve requests for days


class MovingAverage:
    """An exponential moving average, bias-corrected so that its first samples count as a plain mean rather than
    being pulled towards zero; `restart` forgets the history."""

    def __init__(self, alpha: float):
        self.alpha = alpha
        self.value: float | None = None
        self.count = 0  # samples since the last restart
        self._weight = 0.0  # total weight of those samples, 1 - (1 - alpha)^count

    def add(self, x: float) -> None:
        self._weight = (1.0 - self.alpha) * self._weight + self.alpha
        # the incremental form leaves a constant series exactly constant (no float drift)
        prev = 0.0 if self.value is None else self.value
        self.value = prev + (x - prev) * (self.alpha / self._weight)
        self.count += 1

    def restart(self) -> None:
        self.value, self.count, self._weight = None, 0, 0.0


class Governor(Protocol):
    """What the speculative rounds ask of a governor: `decide(force)` before a round (draft this round?),
    `record(drafted, n_tokens, seconds)` after it; `events_since(event_count)`, the decisions logged since
    `event_count` was read (kept in the request's stats)."""

    @property
    def event_count(self) -> int: ...

    def decide(self, force: bool = False) -> bool: ...

    def record(self, drafted: bool, n_tokens: int, seconds: float) -> None: ...

    def events_since(self, event_count: int) -> list[tuple[str, int]]: ...


class SpeedGovernor:
    """The Governor that drafts only while that is faster (the schedule above). Call `decide(force)` before a
    round, then `record(drafted, n_tokens, seconds)` after it, or bracket the round with `begin_round(drafting)` /
    `end_round(n_tokens)` to time it with `clock`."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.plain = MovingAverage(ALPHA)  # tokens per second of plain rounds
        self.spec = MovingAverage(ALPHA)  # tokens per second of speculative rounds
        self.rounds = 0  # rounds recorded over the governor's lifetime; events are indexed by it
        self.interval = PROBE_FIRST  # plain rounds before the next probe
        # phase: "measure_plain" -> "measure_spec" -> "drafting" <-> "plain"
        self._phase = "measure_plain"
        self._left = WARMUP_ROUNDS  # rounds left in the current measurement, refresh or probe (0: none running)
        self._count = 0  # schedule rounds since drafting turned on, the last refresh, or the last probe
        self._events: deque[tuple[str, int]] = deque(maxlen=EVENTS_KEPT)
        self.event_count = 0  # events ever logged; a request notes it at its start, then calls events_since
        self._began: tuple[bool, float] | None = None

    # ---- the decision ------------------------------------------------------------------------------------------
    @property
    def drafting(self) -> bool:
        """Whether the schedule drafts the next round (force aside)."""
        if self._phase == "measure_plain":
            return False
        if self._phase == "measure_spec":
            return True
        if self._phase == "drafting":
            return self._left == 0  # a refresh runs plain rounds
        return self._left > 0  # plain: only a probe drafts

    def decide(self, force: bool = False) -> bool:
        """Draft this round? `force` (fixed seed, temperature > 0) always drafts."""
        return True if force else self.drafting

    # ---- measurements --------------------------------------------------------------------------------------------
    def record(self, drafted: bool, n_tokens: int, seconds: float) -> None:
        """A finished round: whether it drafted, the tokens it emitted and how long it took."""
        if n_tokens < 0 or seconds < 0:
            raise ValueError(f"need n_tokens >= 0 and seconds >= 0, got {n_tokens}, {seconds}")
        planned = self.drafting
        self.rounds += 1
        (self.spec if drafted else self.plain).add(n_tokens / max(seconds, 1e-9))
        # a forced round, or a plain round the caller ran for want of room to draft, is a measurement only
        if drafted == planned:
            self._advance()

    def begin_round(self, drafting: bool) -> None:
        """Start timing a round with the injected clock."""
        self._began = (drafting, self.clock())

    def end_round(self, n_tokens: int) -> None:
        """Finish the round begun by `begin_round` and record it."""
        if self._began is None:
            raise RuntimeError("end_round without begin_round")
        drafting, t0 = self._began
        self._began = None
        self.record(drafting, n_tokens, self.clock() - t0)

    # ---- the log -------------------------------------------------------------------------------------------------
    @property
    def events(self) -> list[tuple[str, int]]:
        """The decisions (kind, round index), oldest first: "spec_on", "spec_off", "probe", "refresh"."""
        return list(self._events)

    def events_since(self, event_count: int) -> list[tuple[str, int]]:
        """The events logged after `event_count` was read (as many as the bounded log still holds)."""
        n = min(self.event_count - event_count, len(self._events))
        return list(self._events)[len(self._events) - n :] if n > 0 else []

    def _log(self, kind: str) -> None:
        self._events.append((kind, self.rounds))  # the index of the first round the decision applies to
        self.event_count += 1

    # ---- the schedule ------------------------------------------------------------------------------------------
    def _faster(self) -> bool:
        spec, plain = self.spec.value, self.plain.value
        return spec is not None and plain is not None and spec >= SPEEDUP * plain

    def _turn(self, on: bool) -> None:
        self._phase, self._left, self._count = ("drafting" if on else "plain"), 0, 0
        self._log("spec_on" if on else "spec_off")

    def _advance(self) -> None:
        """One round of the schedule has run; move it on."""
        if self._left > 0:  # a measurement, refresh or probe is running
            self._left -= 1
            if self._left > 0:
                return
            if self._phase == "measure_plain":
                self._phase, self._left = "measure_spec", WARMUP_ROUNDS
                self.spec.restart()  # speculation is measured after plain, on rounds of its own
            elif self._phase == "plain":  # a probe ended
                if self._faster():
                    self.interval = PROBE_FIRST
                    self._turn(True)
                else:
                    self.interval = min(2 * self.interval, PROBE_MAX)
                    self._turn(False)
            elif self._phase == "measure_spec":
                self._turn(self._faster())
            elif not self._faster():  # a refresh ended and plain decoding is now the faster
                self._turn(False)
            return
        self._count += 1
        if self._phase == "drafting":
            if not self._faster():
                self._turn(False)
            elif self._count >= REFRESH_EVERY:
                self._left, self._count = REFRESH_ROUNDS, 0
                self.plain.restart()
                self._log("refresh")
        elif self._count >= self.interval:  # plain
            self._left, self._count = PROBE_ROUNDS, 0
            self.spec.restart()
            self._log("probe")


class AlwaysDraft:
    """The Governor that drafts every round: the raw cost of speculation, for benchmarks and tests (no measuring,
    no switching off, no events)."""

    event_count = 0

    @property
    def events(self) -> list[tuple[str, int]]:
        return []

    def decide(self, force: bool = False) -> bool:
        return True

    def record(self, drafted: bool, n_tokens: int, seconds: float) -> None:
        pass

    def events_since(self, event_count: int) -> list[tuple[str, int]]:
        return []
