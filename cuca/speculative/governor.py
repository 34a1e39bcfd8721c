"""The governor: draft only while drafting is measurably faster than plain decoding, and pick each round's length.

Measurements (kept as long as the Governor, one per model, across requests):
  * the cost of a round with k drafts verified (the drafter's steps plus a verify pass of M = k + 1 rows; k = 0 is a
    plain step, or a round whose drafter proposed nothing), the median of its last few timings per k (per M), so
    that a stalled round (another process on the core) cannot swing a decision; a length never timed is
    interpolated;
  * the acceptance at each draft position j, conditional on reaching it (the drafts before it all accepted): a_j.
Both are keyed by the drafts the drafter proposed, not the length asked for: a prompt lookup that found nothing ran
a plain step, and counted at the length asked it made that length's median cost a plain step's (drafting looked
free) and its acceptance a blend of the lookup's hit rate and its drafts' quality. Keyed by what was verified, the
rule below asks whether verifying a proposal pays, and rounds with none cost what plain decoding costs.
A round with k drafts is then expected to emit E(k) = 1 + sum_{i<=k} prod_{j<=i} a_j tokens, so its modelled rate
is E(k) / cost(k), and the best length k* maximises it over 1..draft_tokens (draft_tokens is a maximum).

On top of that the product page's on/off schedule, with "speculation" meaning the rate at k*:
  * measure plain first (WARMUP_ROUNDS plain rounds), then speculation (WARMUP_ROUNDS rounds at full length);
  * draft while rate(k*) >= SPEEDUP * plain rate, checked after every round (drafting stops when OFF_CHECKS checks
    in a row fail: one round at a length just tried, its first-use cost and one rejection, must not switch
    speculation off for `interval` rounds); after every REFRESH_EVERY drafting
    rounds, refresh the plain cost with REFRESH_ROUNDS plain rounds; draft once at each length not yet timed, and
    every DEPTH_PROBE_EVERY drafting rounds one longer or one shorter than k* (in turn), so that the next
    position's acceptance and the neighbouring costs stay measured;
  * while plain is faster, re-probe with PROBE_ROUNDS rounds at the best length after `interval` plain rounds (a
    probe or warm-up that accepted some drafts yet left plain the faster runs on, up to TRIAL_MAX_ROUNDS); the
    interval starts at PROBE_FIRST, doubles after each failed probe up to PROBE_MAX, and a successful probe resets it.
    A probe fades the acceptance averages to PROBE_ROUNDS rounds' worth, so that its fresh rounds weigh as much as
    the stale history (which a restart would throw away, and two rounds alone are too few to decide on).
A request with a fixed seed and temperature > 0 drafts the full length every round (`force`) so that equal prompts
reproduce equal tokens; its rounds still feed the measurements but do not advance the schedule. The decisions are
logged as events (kind, round index, round length) that each request copies into its stats.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

ALPHA = 0.05  # weight of the newest acceptance outcome: ~20 rounds of memory (a reply is tens of rounds)
COST_WINDOW = 7  # round costs kept per length: a round's cost barely varies, so a few rounds settle it
WARMUP_ROUNDS = 2
SPEEDUP = 1.02
REFRESH_EVERY = 64
REFRESH_ROUNDS = 2
PROBE_FIRST = 32
PROBE_ROUNDS = 2
TRIAL_MAX_ROUNDS = 6  # a probe with drafts accepted in it runs on (PROBE_ROUNDS at a time) up to this many rounds
PROBE_MAX = 512
DEPTH_PROBE_EVERY = 16
OFF_CHECKS = 3  # failed checks in a row that stop drafting (a refresh's end, a probe or warm-up: one is enough)
PRIOR_ROUNDS = 2  # how many rounds' weight a deeper position's acceptance gives the position before it
DEPTH_MARGIN = 1.01  # another length replaces the current one only when modelled this much faster (no dithering)
EVENTS_KEPT = 4096  # the log is bounded: a model may serve requests for days


class GovernorEvent(NamedTuple):
    """A decision: `kind` ("spec_on", "spec_off", "probe", "refresh", "depth"), the index of the first round it
    applies to (counted over the governor's lifetime), and the round length it sets (0: plain rounds)."""

    kind: str
    round: int
    depth: int


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

    def fade(self, count: int) -> None:
        """Keep the value but weigh it as `count` samples (if it has more), so that new samples count for more."""
        if self.count > count:
            self.count, self._weight = count, 1.0 - (1.0 - self.alpha) ** count


class CostAverage:
    """Seconds per round: the lower median of the last `window` samples. A stall (another process on the core, a
    page fault) only ever lengthens a round, and the first round at a length also pays first-use costs (a drafter's
    weights packed, buffers faulted in): a median drops both, where a moving average carried a first-round spike
    into a rarely probed length's figure for long. A median, not the least: throughput follows the typical round,
    and the least of a few short noisy rounds (prompt lookup on a 7 ms model) models drafting as nearly free."""

    def __init__(self, window: int = COST_WINDOW):
        self.window = window
        self.samples: deque[float] = deque(maxlen=window)
        self.value: float | None = None
        self.count = 0

    def add(self, seconds: float) -> None:
        self.samples.append(seconds)
        ordered = sorted(self.samples)
        self.value = ordered[(len(ordered) - 1) // 2]
        self.count += 1


def expected_tokens(acceptance: list[float], k: int) -> float:
    """E(k) = 1 + sum_{i<=k} prod_{j<=i} a_j: the tokens a round with k drafts emits on average, `acceptance[j-1]`
    being a_j."""
    total, reach = 1.0, 1.0
    for a in acceptance[:k]:
        reach *= a
        total += reach
    return total


class Governor(Protocol):
    """What the speculative rounds ask of a governor: `decide(limit, force)` before a round (how many drafts, in
    0..limit), `record(depth, accepted, seconds)` after it (the drafts proposed and verified, at most the length
    decided; how many were accepted; the round's duration); `events_since(event_count)`, the decisions logged
    since `event_count` was read (kept in the request's stats)."""

    @property
    def event_count(self) -> int: ...

    def decide(self, limit: int, force: bool = False) -> int: ...

    def record(self, depth: int, accepted: int, seconds: float) -> None: ...

    def events_since(self, event_count: int) -> list[GovernorEvent]: ...


class SpeedGovernor:
    """The Governor that drafts only while that is faster, at the best round length (the schedule above). Call
    `decide(limit, force)` before a round, then `record(depth, accepted, seconds)` after it, or bracket the round
    with `begin_round(depth)` / `end_round(accepted)` to time it with `clock`."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.costs: dict[int, CostAverage] = {}  # round length k -> seconds per round (k = 0: a plain step)
        self.accept: list[MovingAverage] = []  # accept[j - 1]: a_j, acceptance at draft position j once reached
        self.max_depth = 0  # the longest round the decoder has allowed (its draft_tokens)
        self.depth = 0  # the round length the schedule drafts at while drafting
        self.rounds = 0  # rounds recorded over the governor's lifetime; events are indexed by it
        self.interval = PROBE_FIRST  # plain rounds before the next probe
        # phase: "measure_plain" -> "measure_spec" -> "drafting" <-> "plain"
        self._phase = "measure_plain"
        self._left = WARMUP_ROUNDS  # rounds left in the current measurement, refresh or probe (0: none running)
        self._trial = [0, 0]  # rounds run and drafts accepted since the current probe or speculation warm-up began
        self._count = 0  # schedule rounds since drafting turned on, the last refresh, or the last probe
        self._slower = 0  # drafting rounds in a row after which plain decoding was modelled the faster
        self._probe_depth = 0
        self._pending: int | None = None  # the length decide() returned for the schedule (None: forced, or none)
        self._events: deque[GovernorEvent] = deque(maxlen=EVENTS_KEPT)
        self.event_count = 0  # events ever logged; a request notes it at its start, then calls events_since
        self._began: tuple[int, float] | None = None

    # ---- the model -------------------------------------------------------------------------------------------------
    def acceptance(self, n: int | None = None) -> list[float]:
        """a_1..a_n (default: up to max_depth). a_1 is its average (1.0 before any: optimistic, so that a drafter
        gets measured at all); a deeper position, reached less often, leans towards the one before it as if that
        one had been seen PRIOR_ROUNDS more times, so a few unlucky rounds there cannot rule out longer rounds."""
        out: list[float] = []
        for j in range(self.max_depth if n is None else n):
            avg = self.accept[j] if j < len(self.accept) else None
            seen, mean = (avg.count, avg.value) if avg is not None and avg.value is not None else (0, 0.0)
            if j == 0:
                out.append(mean if seen else 1.0)
            else:
                out.append((seen * mean + PRIOR_ROUNDS * out[-1]) / (seen + PRIOR_ROUNDS))
        return out

    def cost(self, k: int) -> float | None:
        """Modelled seconds of a round with k drafts, never less than a plain step's: such a round does a plain
        step's work and more, so a cheaper figure is only load that changed between the timings, and must not make
        drafts that are never accepted look faster than plain decoding. (Only against the plain step: a cap from
        another length would carry that length's stale figure over, e.g. a rarely probed length's quiet-moment
        timing making every shorter round look as cheap as a plain step.)"""
        own, plain = self._cost(k), self._cost(0) if k > 0 else None
        return own if own is None or plain is None else max(own, plain)

    def _cost(self, k: int) -> float | None:
        """Round k's own average, else linear between the nearest timed lengths around it, else extrapolated along
        the last two (flat when only one is timed); None before any timing."""
        timed = sorted(d for d, c in self.costs.items() if c.value is not None)
        if not timed:
            return None
        value = {d: float(self.costs[d].value or 0.0) for d in timed}
        if k in value:
            return value[k]
        below, above = [d for d in timed if d < k], [d for d in timed if d > k]
        if below and above:
            lo, hi = below[-1], above[0]
        elif len(timed) >= 2:
            lo, hi = (timed[-2], timed[-1]) if below else (timed[0], timed[1])
        else:
            return value[timed[0]]
        return max(value[lo] + (value[hi] - value[lo]) * (k - lo) / (hi - lo), 1e-9)

    def rate(self, k: int) -> float | None:
        """Modelled tokens per second of rounds with k drafts, E(k) / cost(k); None before any timing."""
        c = self.cost(k)
        return None if c is None else expected_tokens(self.acceptance(k), k) / max(c, 1e-9)

    def best(self, limit: int | None = None) -> tuple[int, float | None]:
        """The length in 1..limit (default max_depth) with the highest modelled rate, and that rate; the current
        length is kept unless another beats it by DEPTH_MARGIN."""
        top = self.max_depth if limit is None else min(limit, self.max_depth)
        if top < 1:
            return 0, None
        rates = {k: self.rate(k) for k in range(1, top + 1)}
        k = max(rates, key=lambda d: (rates[d] or 0.0, -d))
        cur = min(max(self.depth, 1), top)
        if (rates[cur] or 0.0) * DEPTH_MARGIN >= (rates[k] or 0.0):
            k = cur
        return k, rates[k]

    def _faster(self) -> bool:
        _, spec = self.best()
        plain = self.rate(0) if 0 in self.costs else None
        return spec is not None and plain is not None and spec >= SPEEDUP * plain

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

    def decide(self, limit: int, force: bool = False) -> int:
        """How many drafts this round, in 0..limit (the room the round has). `force` (fixed seed, temperature > 0)
        drafts `limit`: the round lengths must not depend on timing for the tokens to reproduce."""
        self.max_depth = max(self.max_depth, limit)
        self._pending = None
        if limit < 1:
            return 0
        if force:
            return limit
        if not self.drafting:
            k = 0
        elif self._phase == "measure_spec":
            k = limit
        elif self._phase == "plain":  # a probe
            k = min(self._probe_depth, limit)
        else:
            k, rate = self.best(limit)
            plain = self.rate(0)
            if limit < self.depth and rate is not None and plain is not None and rate < SPEEDUP * plain:
                return 0  # too little room for a round that pays: plain, a measurement only
            untimed = [d for d in range(1, limit + 1) if d not in self.costs]
            if untimed:
                k = untimed[0]  # once per length: its cost timed rather than interpolated
            elif self._count % DEPTH_PROBE_EVERY == DEPTH_PROBE_EVERY - 1:
                k = self._neighbour(k, limit)
        self._pending = k
        return k

    def _neighbour(self, k: int, limit: int) -> int:
        """A depth probe: one longer than k (that position's acceptance and cost stay measured) or, every other
        time or at the limit, one shorter (that cost too)."""
        up = (self._count // DEPTH_PROBE_EVERY) % 2 == 0 or k == 1
        if up and k < limit:
            return k + 1
        return k - 1 if k > 1 else k

    def begin_request(self) -> None:
        """A request starts. Its text may suit the drafter far better than the last one's (a code edit after
        prose: prompt lookup goes from nothing to most drafts accepted), so while plain decoding is the faster a
        probe runs now rather than after the rest of `interval` plain rounds (which may be the whole request). A
        probe that fails still doubles the interval, and costs PROBE_ROUNDS rounds per request."""
        if self._phase == "plain" and self._left == 0 and self.max_depth > 0:
            self._probe()

    # ---- measurements --------------------------------------------------------------------------------------------
    def record(self, depth: int, accepted: int, seconds: float) -> None:
        """A finished round: the drafts the drafter proposed and the target verified (0: a plain round, or nothing
        proposed; at most the length decide() gave), how many were accepted and how long the round took."""
        if seconds < 0:
            raise ValueError(f"need seconds >= 0, got {seconds}")
        self.record_acceptance(depth, accepted)
        self.record_round(depth, seconds)

    def record_acceptance(self, depth: int, accepted: int) -> None:
        """One sequence's outcome of a round with `depth` drafts verified (a batch's rounds: one call per sequence)."""
        if depth < 0 or not 0 <= accepted <= depth:
            raise ValueError(f"need depth >= 0, 0 <= accepted <= depth; got {depth}, {accepted}")
        self._trial[1] += accepted
        for j in range(min(accepted + 1, depth)):  # positions reached: the accepted ones and the first rejected
            while len(self.accept) <= j:
                self.accept.append(MovingAverage(ALPHA))
            self.accept[j].add(1.0 if j < accepted else 0.0)

    def record_round(self, depth: int, seconds: float) -> None:
        """A round's (or a batch step's) duration, after its acceptance: times `depth` and moves the schedule."""
        planned, self._pending = self._pending, None
        self.rounds += 1
        self.costs.setdefault(depth, CostAverage()).add(seconds)
        # a forced round, or a plain round the caller ran for want of room to draft, is a measurement only; so is a
        # round the drafter proposed nothing in (a lookup without a match): it says nothing of drafting, and a
        # warm-up or probe must not end on such rounds
        if planned is not None and depth <= planned and (depth > 0 or planned == 0):
            self._advance()

    def begin_round(self, depth: int) -> None:
        """Start timing a round with the injected clock."""
        self._began = (depth, self.clock())

    def end_round(self, accepted: int) -> None:
        """Finish the round begun by `begin_round` and record it."""
        if self._began is None:
            raise RuntimeError("end_round without begin_round")
        depth, t0 = self._began
        self._began = None
        self.record(depth, accepted, self.clock() - t0)

    def summary(self) -> dict[str, Any]:
        """The model as data: per round length its cost (ms), E(k) and modelled tok/s; a_j; the schedule's state."""
        ks = range(self.max_depth + 1)
        acc = self.acceptance()
        cost = {k: self.cost(k) for k in ks}
        return {"phase": self._phase, "depth": self.depth, "interval": self.interval, "rounds": self.rounds,
                "acceptance": [round(a, 3) for a in acc],
                "cost_ms": {k: None if c is None else round(c * 1e3, 2) for k, c in cost.items()},
                "timed": {k: self.costs[k].count for k in sorted(self.costs)},
                "expected_tokens": {k: round(expected_tokens(acc, k), 3) for k in ks},
                "modelled_tps": {k: None if c is None else round(expected_tokens(acc, k) / max(c, 1e-9), 2)
                                 for k, c in cost.items()}}

    # ---- the log -------------------------------------------------------------------------------------------------
    @property
    def events(self) -> list[GovernorEvent]:
        """The decisions, oldest first."""
        return list(self._events)

    def events_since(self, event_count: int) -> list[GovernorEvent]:
        """The events logged after `event_count` was read (as many as the bounded log still holds)."""
        n = min(self.event_count - event_count, len(self._events))
        return list(self._events)[len(self._events) - n :] if n > 0 else []

    def _log(self, kind: str, depth: int) -> None:
        self._events.append(GovernorEvent(kind, self.rounds, depth))  # from the next round on
        self.event_count += 1

    # ---- the schedule ------------------------------------------------------------------------------------------
    def _turn(self, on: bool) -> None:
        self._phase, self._left, self._count, self._slower = ("drafting" if on else "plain"), 0, 0, 0
        self.depth = self.best()[0] if on else 0
        self._log("spec_on" if on else "spec_off", self.depth)

    def _reselect(self) -> None:
        k = self.best()[0]
        if k != self.depth:
            self.depth = k
            self._log("depth", k)

    def _extend(self) -> bool:
        """At the end of a probe or of the first speculation rounds that left plain decoding the faster: run
        PROBE_ROUNDS more when some draft was accepted in them, up to TRIAL_MAX_ROUNDS in all. Two unlucky rounds of
        a drafter that is often right must not rule it out for the next `interval` rounds, while a drafter with
        nothing accepted is ruled out as cheaply as before."""
        rounds, accepted = self._trial
        if accepted == 0 or rounds + PROBE_ROUNDS > TRIAL_MAX_ROUNDS or self._faster():
            return False
        self._left = PROBE_ROUNDS
        return True

    def _advance(self) -> None:
        """One round of the schedule has run; move it on."""
        if self._left > 0:  # a measurement, refresh or probe is running
            self._left -= 1
            self._trial[0] += 1
            if self._left > 0:
                return
            if self._phase == "measure_plain":
                self._phase, self._left, self._trial = "measure_spec", WARMUP_ROUNDS, [0, 0]
                return
            if self._phase in ("plain", "measure_spec") and self._extend():
                return
            if self._phase == "plain":  # a probe ended
                on = self._faster()
                self.interval = PROBE_FIRST if on else min(2 * self.interval, PROBE_MAX)
                self._turn(on)
            elif self._phase == "measure_spec":
                self._turn(self._faster())
            elif not self._faster():  # a refresh ended and plain decoding is now the faster
                self._turn(False)
            return
        self._count += 1
        if self._phase == "drafting":
            self._slower = 0 if self._faster() else self._slower + 1
            if self._slower >= OFF_CHECKS:
                self._turn(False)
                return
            self._reselect()
            if self._count >= REFRESH_EVERY:
                self._left, self._count = REFRESH_ROUNDS, 0
                self._log("refresh", 0)
        elif self._count >= self.interval:  # plain
            self._probe()

    def _probe(self) -> None:
        """Start a probe: PROBE_ROUNDS rounds at the best length by what was measured before, the acceptance
        averages faded so that its fresh rounds weigh as much as the history."""
        self._left, self._count, self._trial = PROBE_ROUNDS, 0, [0, 0]
        self._probe_depth = self.best()[0]
        for avg in self.accept:
            avg.fade(PROBE_ROUNDS)
        self._log("probe", self._probe_depth)


class AlwaysDraft:
    """The Governor that drafts the full length every round: the raw cost of a fixed round length, for benchmarks,
    `--no-governor` and tests (no measuring, no switching off, no events)."""

    event_count = 0

    @property
    def events(self) -> list[GovernorEvent]:
        return []

    def decide(self, limit: int, force: bool = False) -> int:
        return max(limit, 0)

    def record(self, depth: int, accepted: int, seconds: float) -> None:
        pass

    def events_since(self, event_count: int) -> list[GovernorEvent]:
        return []
