"""The governor of a batch: one drafting decision per forward pass, judged on the whole batch's throughput.

With several sequences in a pass, a verify pass of B x (k + 1) rows is no longer nearly free, so what has to beat
plain decoding is the batch's tokens per second, not one sequence's. Every sequence of a step drafts the step's
length k (fewer where its round has less room; a seeded sampling request keeps its full length, as alone); the
step's cost is the time between the ends of two consecutive passes (drafting, heads, the pass itself); each
sequence's acceptance counts once. A step of B sequences all at k then emits B x E(k) tokens in cost_B(k), so the
SpeedGovernor's rule E(k) / cost(k) >= 1.02 / cost(0), with costs measured at that batch size, is the rule on the
batch's throughput. Costs change with B, so there is one SpeedGovernor per batch-size class (1, 2, 3-4, 5-8, ...).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .governor import EVENTS_KEPT, GovernorEvent, SpeedGovernor


@dataclass
class PassClock:
    """What the batcher tells the governor: passes run so far, the seconds between the ends of the last two, and
    how many sequences are active."""

    passes: int = 0
    period: float = 0.0
    active: int = 0


def size_class(n: int) -> int:
    """0 for one sequence, 1 for two, 2 for 3-4, 3 for 5-8, ..."""
    return max(n - 1, 0).bit_length()


class BatchGovernor:
    """The shared decisions of a batcher's sequences (`view()` gives each lane its Governor)."""

    def __init__(self, clock: PassClock, draft_tokens: int):
        self.clock, self.draft_tokens = clock, draft_tokens
        self.classes: dict[int, SpeedGovernor] = {}
        self._step: tuple[int, int, int] | None = None  # (pass index, size class, depth) of the open step
        self._events: deque[GovernorEvent] = deque(maxlen=EVENTS_KEPT)  # every class's, in order
        self._copied: dict[int, int] = {}  # per class: its event_count when last copied
        self.event_count = 0

    def governor(self, cls: int) -> SpeedGovernor:
        return self.classes.setdefault(cls, SpeedGovernor())

    @property
    def drafting(self) -> bool:
        """Whether the class of the current batch size drafts (for the server's metrics)."""
        g = self.classes.get(size_class(self.clock.active))
        return g is not None and g.drafting

    def decide(self, limit: int, force: bool) -> int:
        """A sequence's round length for the next pass: the step's length (decided at its first round), capped."""
        p = self.clock.passes
        if self._step is None or self._step[0] != p:
            self._close()
            cls = size_class(self.clock.active)
            g = self.governor(cls)
            self._step = (p, cls, g.decide(self.draft_tokens))
            self._copy_events(cls, g)
        if force:
            return limit
        return min(self._step[2], limit)

    def record(self, depth: int, accepted: int) -> None:
        """One sequence's outcome (acceptance only: the step's cost is recorded once, when the next step opens)."""
        if self._step is not None and depth > 0:
            self.governor(self._step[1]).record_acceptance(depth, accepted)

    def _close(self) -> None:
        """The open step's pass has run (the clock moved on): its cost is the last period."""
        if self._step is None or self.clock.passes != self._step[0] + 1:
            return  # no pass, or several, since it opened: no clean timing
        _, cls, depth = self._step
        g = self.governor(cls)
        g.record_round(depth, self.clock.period)
        self._copy_events(cls, g)

    def _copy_events(self, cls: int, g: SpeedGovernor) -> None:
        for e in g.events_since(self._copied.get(cls, 0)):
            self._events.append(e)
            self.event_count += 1
        self._copied[cls] = g.event_count

    def events_since(self, event_count: int) -> list[GovernorEvent]:
        n = min(self.event_count - event_count, len(self._events))
        return list(self._events)[len(self._events) - n :] if n > 0 else []

    def view(self) -> LaneGovernor:
        return LaneGovernor(self)


class LaneGovernor:
    """One lane's Governor (what its SpeculativeDecoder calls): decisions and records go to the shared one."""

    def __init__(self, shared: BatchGovernor):
        self.shared = shared

    @property
    def event_count(self) -> int:
        return self.shared.event_count

    def decide(self, limit: int, force: bool = False) -> int:
        return self.shared.decide(limit, force) if limit > 0 else 0

    def record(self, depth: int, accepted: int, seconds: float) -> None:
        self.shared.record(depth, accepted)

    def events_since(self, event_count: int) -> list[GovernorEvent]:
        return self.shared.events_since(event_count)
