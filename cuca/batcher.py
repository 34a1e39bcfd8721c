"""Continuous batching: the requests in flight share every forward pass, and each reply is the one it gets alone.

Each admitted request runs its own pipeline (engine, speculative decoder, drafter) on a lane: a cache slot with its
prompt cache and its drafter. The pipeline runs on a thread of its own, but only one such thread runs at a time:
its model calls (the trunk's rows, the head) go through the lane's `LaneModel`, which hands the call to the
stepper and waits. The stepper runs every lane until it waits, then serves the waiting calls together:
  1. every waiting head call (decode and verify rows, a prompt's last row) in one batched head, again until none
     is left (a lane that gets logits samples, verifies, drafts, then asks for its next rows);
  2. one `forward_batch` of every lane's rows: decode and verify rows first, prefill chunks (PREFILL_CHUNK rows,
     as alone) while the row budget lasts; the others wait for the next pass.
Every kernel is batch invariant and attention and recurrent state are per sequence, so each row is what that
sequence computes alone whatever else shares the pass: exactness needs nothing more. A lane's calls are the very
calls it makes alone (same rows, same chunks: the hybrid's chunked form depends on them), only served together.
Drafters run on their lane's thread, one at a time (their own passes are not batched). A request that is
cancelled while it waits gets an error at its next call and leaves; its slot is free at the next step. A request
alone (no other active, none queued) serves its own calls on its thread: no handoff per call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .engine import PREFILL_CHUNK, Engine
from .errors import CucaError
from .models.batch import Decoder, SeqRows
from .scheduler import QueueWorker, Request
from .speculative.batch_governor import PassClock
from .speculative.drafters import Drafter
from .speculative.governor import Governor

ROW_BUDGET = PREFILL_CHUNK + 128  # rows per pass: every decode/verify row and one prefill chunk


class Cancelled(CucaError):
    """What a cancelled request's pipeline gets from its next model call (nobody reads it)."""


@dataclass
class Lane:
    """Where a request runs: an engine (its cache, its prompt cache) on `model`, the drafter bound to that cache,
    and the governor its speculative decoder asks."""

    engine: Engine
    drafter: Drafter | None
    governor: Governor
    index: int = 0


class LaneModel(Decoder):
    """The model as a lane's pipeline sees it: attributes are the model's; `forward_batch` (one sequence) and
    `head` wait for the stepper to serve them with every other lane's."""

    def __init__(self, model: Any):
        self._model = model
        self.seq: _Seq | None = None  # the request running on this lane

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def _call(self, kind: str, payload: Any) -> Any:
        if self.seq is None:
            raise RuntimeError("a lane's model is called outside the batcher")
        return self.seq.call(kind, payload)

    def forward_batch(self, seqs: Sequence[SeqRows]) -> np.ndarray:
        if len(seqs) != 1:
            raise ValueError("a lane brings one sequence per pass")
        return self._call("rows", seqs[0])

    def head(self, h: np.ndarray) -> np.ndarray:
        return self._call("head", h)


class _Seq:
    """One admitted request and its thread. The thread and the stepper hand control to each other: exactly one
    of them runs at any time."""

    def __init__(self, req: Request, lane: Lane, model: LaneModel, batcher: Batcher):
        self.req, self.lane, self.model, self.batcher = req, lane, model, batcher
        self.want: tuple[str, Any] | None = None  # the call it waits on (None: runnable, or done)
        self.reply: Any = None
        self.error: BaseException | None = None
        self.done = False
        self._go, self._back = threading.Semaphore(0), threading.Semaphore(0)
        self._thread: threading.Thread | None = None

    def _main(self) -> None:
        self._go.acquire()
        try:
            self.req._serve()
        finally:
            self.done, self.want = True, None
            self._back.release()

    def call(self, kind: str, payload: Any) -> Any:
        """On the request's thread: wait for the stepper to serve this call (or serve it here, when alone)."""
        b = self.batcher
        if b.clock.active == 1 and not b._queue:  # the stepper waits for this thread: nobody else runs
            return b._direct(kind, payload)
        self.want = (kind, payload)
        self._back.release()
        self._go.acquire()
        error, self.error = self.error, None
        if error is not None:
            raise error
        out, self.reply = self.reply, None
        return out

    def resume(self) -> None:
        """On the stepper: run the request until its next call or its end."""
        self.want = None
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name=f"cuca-lane-{self.lane.index}", daemon=True)
            self._thread.start()
        self._go.release()
        self._back.acquire()


@dataclass
class _Entry:
    """A queued request and the job it runs once it has a lane."""

    req: Request
    job: Callable[[Lane], Iterator[Any]]


class Batcher(QueueWorker):
    """A FIFO of requests, `lanes` to run them on, and the stepper thread (started on the first request) that
    serves their model calls in shared passes. The Scheduler's interface: submit, close, pending."""

    def __init__(self, model: Any, lanes: Sequence[tuple[Lane, LaneModel]], clock: PassClock,
                 name: str = "cuca-batcher", row_budget: int = ROW_BUDGET):
        if not lanes:
            raise ValueError("a batcher needs at least one lane")
        super().__init__(name)
        self.model, self.clock, self.row_budget = model, clock, row_budget
        self._free: list[tuple[Lane, LaneModel]] = list(lanes)[::-1]  # popped from the end: lane 0 first
        self._t0 = 0.0  # when the last pass ended

    @property
    def lanes(self) -> int:
        return len(self._free) + self.clock.active

    def submit(self, job: Callable[..., Iterator[Any]]) -> Request:
        """Queue `job` (called with its Lane once it has one); its items arrive through the returned request."""
        entry = _Entry(Request(lambda: iter(())), job)
        self._enqueue(entry)
        return entry.req

    def _request(self, item: Any) -> Request:
        return item.req

    # ---- the stepper ---------------------------------------------------------------------------------------
    def _run(self) -> None:
        active: list[_Seq] = []
        while True:
            with self._cond:
                while not self._queue and not active and not self._closed:
                    self._cond.wait()
                if not self._queue and not active:
                    return
                if not active:  # after idle time: the first pass's cost starts now
                    self._t0 = time.perf_counter()
                while self._queue and self._free:
                    active.append(self._admit(self._queue.popleft()))
            self.clock.active = len(active)
            try:
                self._step(active)
            except BaseException as e:  # noqa: BLE001 - a failed pass fails its requests, never the stepper
                for s in active:
                    if s.want is not None:
                        s.error, s.want = e, None
            self._retire(active)

    def _admit(self, e: _Entry) -> _Seq:
        """The free lane the job scores best (its `affinity(lane)`: prompt rows that lane's cache keeps), else the
        one freed last."""
        score = getattr(e.job, "affinity", None)
        best = len(self._free) - 1
        if score is not None:
            scores = [_score(score, lane) for lane, _ in self._free]
            best = max(range(len(scores)), key=lambda i: (scores[i], i))
        lane, model = self._free.pop(best)
        s = _Seq(e.req, lane, model, self)
        model.seq = s
        e.req._job = lambda: e.job(lane)
        return s

    def _retire(self, active: list[_Seq]) -> None:
        """Free the lanes of finished requests (cancelled ones are finished first)."""
        for s in active:
            for _ in range(64):  # a pipeline unwinding makes no model calls, but never loop forever
                if s.done or not (s.req.cancelled and s.want is not None):
                    break
                s.error = Cancelled(f"{self.name}: the request was cancelled")
                s.resume()
        done = [s for s in active if s.done]
        for s in done:
            active.remove(s)
            s.model.seq = None
            with self._cond:
                self._free.append((s.lane, s.model))
        self.clock.active = len(active)

    def _advance(self, seqs: list[_Seq]) -> None:
        for s in seqs:
            if not s.done:
                s.resume()

    def _step(self, active: list[_Seq]) -> None:
        """Run every lane until it waits, serve the heads, then one pass."""
        self._advance([s for s in active if s.want is None])
        while heads := [s for s in active if s.want is not None and s.want[0] == "head"]:
            self._heads(heads)
            self._advance(heads)
        waiting = [s for s in active if s.want is not None and s.want[0] == "rows"]
        if waiting:
            self._pass(waiting)

    def _passed(self) -> None:
        """A pass ended: its cost for the governor is the time since the previous one ended (drafting, heads, the
        pass itself)."""
        now = time.perf_counter()
        self.clock.period, self._t0 = now - self._t0, now
        self.clock.passes += 1

    def _direct(self, kind: str, payload: Any) -> Any:
        """A lone request's call, on its own thread (errors are its own)."""
        if kind == "head":
            return self.model.head(np.ascontiguousarray(payload, np.float32))
        h = self.model.forward_batch([payload])
        self._passed()
        return h

    def _heads(self, seqs: list[_Seq]) -> None:
        hs = [np.ascontiguousarray(s.want[1], np.float32) for s in seqs if s.want is not None]
        try:
            logits = self.model.head(hs[0] if len(hs) == 1 else np.concatenate(hs))
        except Exception as e:  # noqa: BLE001 - delivered to the callers
            for s in seqs:
                s.error = e
            return
        r = 0
        for s, h in zip(seqs, hs, strict=True):
            s.reply = logits[r : r + h.shape[0]]
            r += h.shape[0]

    def _pass(self, waiting: list[_Seq]) -> None:
        """One forward pass of the waiting rows: the shortest first, while the row budget lasts (at least one)."""
        chosen: list[_Seq] = []
        rows = 0
        for s in sorted(waiting, key=lambda s: int(s.want[1].tokens.shape[0]) if s.want else 0):
            assert s.want is not None
            sr: SeqRows = s.want[1]
            m = int(sr.tokens.shape[0])
            if chosen and rows + m > self.row_budget:
                continue
            try:
                sr.cache.check_room(int(sr.positions[0]), m)  # one sequence's bad rows fail it alone
            except Exception as e:  # noqa: BLE001
                s.error, s.want = e, None
                continue
            chosen.append(s)
            rows += m
        if not chosen:
            return
        h = self.model.forward_batch([s.want[1] for s in chosen if s.want is not None])
        self._passed()
        r = 0
        for s in chosen:
            assert s.want is not None
            m = int(s.want[1].tokens.shape[0])
            s.reply, s.want = h[r : r + m], None
            r += m


def _score(affinity: Callable[[Lane], int], lane: Lane) -> int:
    try:
        return int(affinity(lane))
    except Exception:  # noqa: BLE001 - a prompt that fails fails in its job, where its consumer sees it
        return 0
