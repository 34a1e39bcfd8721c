"""The scheduler and LocalModel under concurrency (issue 13, defects 1 and 2): one worker thread owns the model;
any mix of sync and async requests from any thread never blocks for good, and every reply equals the same request
run alone. Every wait here is bounded, so a deadlock fails the test instead of hanging the suite."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from synth import Tiny, write_tiny

from cuca import LocalModel, LocalModelConfig
from cuca.engine import Generation
from cuca.errors import CucaError
from cuca.scheduler import DONE, Scheduler, SyncStream
from cuca.speculative.source import DrafterSource

LIMIT_S = 120.0  # a hang guard, not a speed bound: everything here takes a few seconds at most


def bounded(fn: Callable[[], Any], limit: float = LIMIT_S) -> Any:
    """fn() in a daemon thread; fails (rather than hangs) when it does not finish within `limit` seconds."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit)
    assert not t.is_alive(), f"deadlock: still blocked after {limit:.0f} s"
    if "error" in out:
        raise out["error"]
    return out.get("value")


# ---- the scheduler alone ---------------------------------------------------------------------------------------
def test_scheduler_runs_jobs_in_arrival_order_on_one_thread() -> None:
    s = Scheduler("test")
    seen: list[tuple[int, str]] = []

    def job(i: int) -> Callable[[], Iterator[int]]:
        def steps() -> Iterator[int]:
            seen.append((i, threading.current_thread().name))
            yield i

        return steps

    reqs = [s.submit(job(i)) for i in range(20)]
    assert bounded(lambda: [(r.get(), r.get()) for r in reqs]) == [(i, DONE) for i in range(20)]
    assert [i for i, _ in seen] == list(range(20)) and {n for _, n in seen} == {"test"}
    s.close()


def test_a_request_queued_when_the_model_closes_gets_an_error_not_an_empty_reply() -> None:
    s = Scheduler("test")
    started, go = threading.Event(), threading.Event()

    def running() -> Iterator[int]:
        started.set()
        go.wait(60)
        yield 1

    first = s.submit(running)
    assert started.wait(60)
    queued = s.submit(lambda: iter([2]))
    s.close()
    go.set()
    assert bounded(lambda: (first.get(), first.get())) == (1, DONE)  # the running job finishes
    with pytest.raises(CucaError, match="closed before this request started"):
        bounded(queued.get)


def test_a_cancelled_job_stops_at_its_next_step_and_errors_reach_the_consumer() -> None:
    s = Scheduler("test")
    step = threading.Event()
    ran: list[int] = []

    def slow() -> Iterator[int]:
        for i in range(1000):
            ran.append(i)
            yield i
            assert step.wait(LIMIT_S)

    def broken() -> Iterator[int]:
        yield 1
        raise ValueError("boom")

    stream = SyncStream(s, slow)
    assert next(stream) == 0
    del stream  # dropped: cancelled
    step.set()
    r = s.submit(broken)
    assert bounded(r.get) == 1
    with pytest.raises(ValueError, match="boom"):
        bounded(r.get)
    assert ran == [0, 1]  # the step after the drop ran, and no other
    s.close()


# ---- LocalModel ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> LocalModel:
    path = write_tiny(tmp_path_factory.mktemp("sched") / "tiny.gguf", arch="gemma3", shape=Tiny(untied=True))
    return LocalModel.load_sync(LocalModelConfig(path, drafter=DrafterSource.prompt_lookup(), threads=1))


PROMPTS = ["abc", "hello", "xyz zy", "the cat"]
REQUESTS: list[tuple[str, dict[str, Any]]] = [
    (p, kw)
    for i, p in enumerate(PROMPTS)
    for kw in (dict(max_tokens=10 + i), dict(max_tokens=12, temperature=1.0, top_k=40, seed=7 + i))
]


def _key(text: str, gen_or_reply: Any) -> tuple[str, list[int], str]:
    return text, list(gen_or_reply.tokens), gen_or_reply.finish_reason or "length"


def alone(model: LocalModel) -> list[tuple[str, list[int], str]]:
    out = []
    for p, kw in REQUESTS:
        r = model.complete_sync(p, **kw)
        out.append(_key(r.text, r))
    return out


def test_many_concurrent_async_streams_and_requests_do_not_deadlock(model: LocalModel) -> None:
    """Defect 1: more concurrent streams than the default thread pool has workers, plus other async requests."""
    want = alone(model)

    async def stream(i: int) -> tuple[str, list[int], str]:
        p, kw = REQUESTS[i % len(REQUESTS)]
        gen = Generation()
        text = "".join([x async for x in model.stream(p, gen=gen, **kw)])
        return _key(text, gen)

    async def complete(i: int) -> tuple[str, list[int], str]:
        p, kw = REQUESTS[i % len(REQUESTS)]
        r = await model.complete(p, **kw)
        return _key(r.text, r)

    async def main() -> list[tuple[str, list[int], str]]:
        return list(await asyncio.gather(*[stream(i) for i in range(12)], *[complete(i) for i in range(6)]))

    got = bounded(lambda: asyncio.run(main()))
    assert got == [want[i % len(want)] for i in range(12)] + [want[i % len(want)] for i in range(6)]


def test_abandoned_streams_that_stay_referenced_do_not_hold_the_model(model: LocalModel) -> None:
    """Defect 2: `async for ... break` with the stream still referenced, and a partly read sync iterator followed
    by a request from the same thread. The abandoned request finishes in the background; its rest stays readable."""
    want = alone(model)
    (p0, kw0), (p1, kw1) = REQUESTS[0], REQUESTS[3]

    async def main() -> tuple[Any, Any, str]:
        s, first = model.stream(p0, **kw0), ""
        async for piece in s:
            first = piece
            break
        r = await model.complete(p1, **kw1)  # deadlocked on main: s held the model's lock
        rest = "".join([x async for x in s])
        return r, s, first + rest

    r, s, text = bounded(lambda: asyncio.run(main()))
    assert _key(r.text, r) == want[3] and text == want[0][0]

    def same_thread() -> tuple[str, Any, str]:
        it = model.stream_sync(p1, **kw1)
        first = next(it)
        r = model.complete_sync(p0, **kw0)  # the thread that holds the iterator: deadlocked itself on main
        return first, r, "".join(it)

    first, r, rest = bounded(same_thread)
    assert _key(r.text, r) == want[0] and first + rest == want[3][0]


class Gate(list[int]):
    """A Generation's token list whose `at`-th append waits until `release` is set: the worker stops right before
    the token after the first piece, so a test can drop or cancel the stream there and see where it stopped."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.release = at, threading.Event()

    def append(self, tok: int) -> None:
        if len(self) + 1 == self.at:
            assert self.release.wait(LIMIT_S)
        super().append(tok)


def _tokens_to_first_piece(model: LocalModel, tokens: list[int]) -> int:
    dec = model.tokenizer.stream(skip_special=True)
    return next(k for k, t in enumerate(tokens, 1) if dec.feed(t))


@pytest.mark.parametrize("how", ["sync del", "sync close", "async del", "async aclose", "task cancel"])
def test_dropped_closed_or_cancelled_streams_stop_at_their_next_token(model: LocalModel, how: str) -> None:
    """Defect 2: a stream that is dropped, closed or whose task is cancelled frees the model at its next token."""
    p, kw = "hello", dict(max_tokens=200, temperature=1.0, seed=1)
    ref = model.complete_sync(p, **kw)
    k = _tokens_to_first_piece(model, ref.tokens)
    assert len(ref.tokens) > k + 1
    gen = Generation(tokens=Gate(k + 1))

    def sync() -> None:
        s = model.stream_sync(p, gen=gen, **kw)
        assert next(s)
        if how == "sync close":
            s.close()
        del s
        gc.collect()

    async def asyn() -> None:
        s = model.stream(p, gen=gen, **kw)
        if how == "task cancel":
            got_one = asyncio.Event()

            async def read(stream: Any) -> None:
                async for _ in stream:
                    got_one.set()

            task = asyncio.create_task(read(s))
            await asyncio.wait_for(got_one.wait(), LIMIT_S)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return
        assert await s.__anext__()
        if how == "async aclose":
            await s.aclose()  # type: ignore[attr-defined]
        del s
        gc.collect()

    bounded(sync if how.startswith("sync") else lambda: asyncio.run(asyn()))
    gen.tokens.release.set()  # type: ignore[attr-defined]
    after = bounded(lambda: model.complete_sync(p, **kw))
    assert after.tokens == ref.tokens
    assert k <= len(gen.tokens) <= k + 1  # stopped right after the piece it delivered, or at the next token


def test_concurrent_async_streams_threads_and_abandoned_streams_equal_requests_run_alone(model: LocalModel) -> None:
    """The must-show: 32 concurrent async streams, 8 threads of complete_sync, and cancelled and abandoned streams,
    all on one model at once: every reply equals the same request run alone (greedy and seeded), nothing blocks."""
    want = alone(model)
    n = len(REQUESTS)
    bad: list[str] = []
    start = threading.Barrier(9)

    async def stream(i: int) -> None:
        p, kw = REQUESTS[i % n]
        gen = Generation()
        text = "".join([x async for x in model.stream(p, gen=gen, **kw)])
        if _key(text, gen) != want[i % n]:
            bad.append(f"async stream {i}")

    async def abandon(i: int, how: str) -> Any:
        p, kw = REQUESTS[i % n]
        s = model.stream(p, **{**kw, "max_tokens": 60})
        first = await s.__anext__()  # type: ignore[attr-defined]
        if how == "aclose":
            await s.aclose()  # type: ignore[attr-defined]
        return (i, first, s) if how == "keep" else None

    async def cancelled(i: int) -> None:
        p, kw = REQUESTS[i % n]
        task = asyncio.create_task(model.complete(p, **{**kw, "max_tokens": 60}))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async def main() -> None:
        start.wait(LIMIT_S)
        kept = await asyncio.gather(
            *[stream(i) for i in range(32)],
            *[abandon(i, how) for i, how in enumerate(["keep", "keep", "aclose", "drop", "drop"])],
            *[cancelled(i) for i in range(3)],
        )
        # the streams kept unread while 40 other requests ran resume where they stopped, as if run alone
        for i, first, s in [k for k in kept if k is not None]:
            p, kw = REQUESTS[i % n]
            rest = "".join([x async for x in s])
            if first + rest != (await model.complete(p, **{**kw, "max_tokens": 60})).text:
                bad.append(f"kept stream {i}")

    def thread(t: int) -> None:
        start.wait(LIMIT_S)
        if t == 0:  # a partly read sync iterator, kept, then more requests from the same thread
            it = model.stream_sync(*REQUESTS[1][:1], **{**REQUESTS[1][1], "max_tokens": 60})
            next(it)
        for j in range(4):
            p, kw = REQUESTS[(t * 4 + j) % n]
            r = model.complete_sync(p, **kw)
            if _key(r.text, r) != want[(t * 4 + j) % n]:
                bad.append(f"thread {t} request {j}")

    workers = [threading.Thread(target=thread, args=(t,), daemon=True) for t in range(8)]
    for w in workers:
        w.start()
    bounded(lambda: asyncio.run(main()))
    for w in workers:
        w.join(LIMIT_S)
        assert not w.is_alive(), "deadlock: a complete_sync thread is still blocked"
    assert bad == []
    assert bounded(lambda: alone(model)) == want and model.scheduler.pending == 0
