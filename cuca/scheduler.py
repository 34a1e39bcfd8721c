"""The request scheduler: one worker thread owns a model and runs queued jobs one at a time, in arrival order.

A job is a generator run on the worker; what it yields travels to the request's consumer (any thread, sync or
async) through the request's own unbounded channel, so the worker never waits on a consumer and a consumer never
holds the model. A job yields None at every step with nothing to deliver (a token that produced no text), so a
cancelled request stops at its next step. A channel holds at most what one job yields (max_tokens pieces).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Protocol

from .errors import CucaError

JobFn = Callable[[], Iterator[Any]]


class Queue(Protocol):
    """What a stream needs of a scheduler (or a batcher): queue a job, get its request."""

    def submit(self, job: JobFn) -> Request: ...


class _End:
    """The last item of a channel: the job finished (error None) or raised `error`."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None):
        self.error = error


DONE = object()  # what get()/aget() return once a request has delivered everything


class Request:
    """One job and the channel its items come back through. The worker puts; exactly one consumer gets."""

    def __init__(self, job: JobFn):
        self._job: JobFn | None = job
        self._cond = threading.Condition(threading.Lock())
        self._items: deque[Any] = deque()
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
        self.cancelled = False
        self._error: BaseException | None = None  # a skipped job's reason, for its consumer

    def cancel(self, error: BaseException | None = None) -> None:
        """Stop at the job's next step (or skip it, if it has not started); safe from any thread, idempotent.
        `error`: what a skipped job's consumer gets instead of the end of its items."""
        self.cancelled = True
        if error is not None:
            self._error = error

    # ---- the worker's side -------------------------------------------------------------------------------
    def _put(self, item: Any) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify()
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            loop, fut = waiter
            try:
                loop.call_soon_threadsafe(_wake, fut)
            except RuntimeError:  # the consumer's event loop is closed: nobody will read this request
                self.cancel()

    def _serve(self) -> None:
        job, self._job = self._job, None  # drop the closure (and the model it holds) once served
        error: BaseException | None = self._error if self.cancelled else None
        if job is not None and not self.cancelled:
            steps: Iterator[Any] | None = None
            try:
                steps = job()
                for item in steps:
                    if item is not None:
                        self._put(item)
                    if self.cancelled:
                        break
            except BaseException as e:  # noqa: BLE001 - delivered to the consumer, never lost on the worker
                error = e
            finally:
                close = getattr(steps, "close", None)
                if close is not None:
                    try:
                        close()
                    except BaseException as e:  # noqa: BLE001
                        error = error or e
        self._put(_End(error))

    # ---- the consumer's side -----------------------------------------------------------------------------
    def _pop(self) -> Any:
        item = self._items[0]
        if isinstance(item, _End):  # stays in place: every later get sees the end too
            if item.error is not None:
                raise item.error
            return DONE
        return self._items.popleft()

    def get(self) -> Any:
        """The next item, blocking this thread until there is one; DONE at the end; re-raises the job's error."""
        with self._cond:
            while not self._items:
                self._cond.wait()
            return self._pop()

    async def aget(self) -> Any:
        """The next item without blocking the event loop; DONE at the end; re-raises the job's error."""
        loop = asyncio.get_running_loop()
        while True:
            with self._cond:
                if self._items:
                    return self._pop()
                fut: asyncio.Future[None] = loop.create_future()
                self._waiter = (loop, fut)
            try:
                await fut
            finally:
                with self._cond:
                    if self._waiter is not None and self._waiter[1] is fut:
                        self._waiter = None


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class QueueWorker:
    """A FIFO of queued items and the one worker thread (started on the first item) that serves them; `close`
    cancels what is still queued. Subclasses say how to run (`_run`) and which request an item is (`_request`)."""

    def __init__(self, name: str):
        self.name = name
        self._queue: deque[Any] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._closed = False

    def _enqueue(self, item: Any) -> None:
        with self._cond:
            if self._closed:
                raise CucaError(f"{self.name}: the model is closed")
            self._queue.append(item)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify()

    def _request(self, item: Any) -> Request:
        return item

    def close(self) -> None:
        """No new requests; the running ones finish, the queued ones are cancelled, the worker exits."""
        with self._cond:
            self._closed = True
            for item in self._queue:
                self._request(item).cancel(CucaError(f"{self.name}: the model was closed before this request started"))
            self._cond.notify()

    @property
    def pending(self) -> int:
        """Requests queued and not yet started."""
        with self._cond:
            return len(self._queue)

    def _run(self) -> None:
        raise NotImplementedError


class Scheduler(QueueWorker):
    """Requests run one at a time, in arrival order, on the worker thread."""

    def __init__(self, name: str = "cuca-model"):
        super().__init__(name)

    def submit(self, job: JobFn) -> Request:
        """Queue `job`; its items arrive through the returned request."""
        req = Request(job)
        self._enqueue(req)
        return req

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                req = self._queue.popleft()
            req._serve()
            del req  # hold nothing of a finished request while idle


class SyncStream(Iterator[Any]):
    """A request's items as a plain iterator. The job is queued on the first `next()`; closing the stream, or
    dropping the last reference to it, cancels the request."""

    def __init__(self, scheduler: Queue, job: JobFn):
        self._scheduler: Queue | None = scheduler
        self._job: JobFn | None = job
        self._req: Request | None = None

    def __iter__(self) -> SyncStream:
        return self

    def __next__(self) -> Any:
        if self._req is None:
            if self._scheduler is None or self._job is None:
                raise StopIteration
            self._req = self._scheduler.submit(self._job)
            self._job = None
        item = self._req.get()
        if item is DONE:
            raise StopIteration
        return item

    def close(self) -> None:
        self._scheduler, self._job = None, None
        if self._req is not None:
            self._req.cancel()

    def __enter__(self) -> SyncStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


class AsyncStream(AsyncIterator[Any]):
    """A request's items as an async iterator (`async for`), read without blocking the event loop. The job is
    queued on the first `__anext__`; `aclose()`, dropping the stream or cancelling the reading task cancels it."""

    def __init__(self, scheduler: Queue, job: JobFn):
        self._sync = SyncStream(scheduler, job)

    def __aiter__(self) -> AsyncStream:
        return self

    async def __anext__(self) -> Any:
        s = self._sync
        if s._req is None:
            if s._scheduler is None or s._job is None:
                raise StopAsyncIteration
            s._req = s._scheduler.submit(s._job)
            s._job = None
        try:
            item = await s._req.aget()
        except asyncio.CancelledError:
            s.close()
            raise
        if item is DONE:
            raise StopAsyncIteration
        return item

    async def aclose(self) -> None:
        self._sync.close()

    def close(self) -> None:
        self._sync.close()
