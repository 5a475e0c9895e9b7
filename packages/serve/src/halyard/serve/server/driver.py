"""`AsyncEngine`: the synchronous `halyard.serve.Engine` driven from asyncio.

The engine is single-threaded: one background thread owns it and is the only one to call it. It runs the
step loop while there is work and sleeps on its command queue when there is none. The event loop's side
submits and cancels through that thread-safe queue; each step's `Update` s go back to the event loop (one
``call_soon_threadsafe`` per step, not per update), which gives them their text there (`Detokenizer`: the
engine handed its text off, so its thread only steps), puts them on the asyncio queue of the request they
belong to, and sends the engine thread a ``stop`` command for each sample a stop string ended. A request's queue
receives its updates, then nothing once every sample has finished; if the request cannot finish (the
server shuts down, the engine fails) it receives an `EngineUnavailable` instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import Any

from halyard.serve.detokenizer import Detokenizer
from halyard.serve.engine import Engine
from halyard.serve.outputs import Update
from halyard.serve.params import SamplingParams
from halyard.serve.replicas import Replicas
from halyard.serve.requests import new_request_id

logger = logging.getLogger("halyard.serve.server")


class EngineUnavailable(RuntimeError):
    """The request could not be (or was not) finished: the server is shutting down or the engine failed."""


@dataclasses.dataclass
class _Route:
    """Where one request's updates go (owned by the engine thread)."""

    loop: asyncio.AbstractEventLoop
    updates: asyncio.Queue
    unfinished: int


class AsyncEngine:
    """An `Engine` (or `Replicas`: the same interface) in a background thread, used from asyncio.

    Args:
        engine: the engine; only the background thread calls it once `start` ran.
    """

    def __init__(self, engine: Engine | Replicas):
        self.engine = engine
        decode = engine.hand_off_text()
        self._text = None if decode is None else Detokenizer(decode)
        self._text_lock = threading.Lock()  # the detokenizer is shared by the event loops and `cancel`
        self._commands: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._routes: dict[str, _Route] = {}
        self._thread = threading.Thread(target=self._loop, name="halyard-serve-engine", daemon=True)
        self._closing = False
        self._submitting = threading.Lock()  # no submission slips in after the thread's last look
        self._drain_deadline: float | None = None
        self.failure: BaseException | None = None
        self.stats: dict[str, float] = {**engine.stats.as_dict(), "requests_in_flight": 0}
        """The engine's counters after its last step (`halyard.serve.EngineStats`), plus
        ``requests_in_flight`` (requests whose caller still waits); replaced, never changed in place."""

    # -- the event loop's side ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine thread."""
        self._thread.start()

    async def submit(
        self, prompt: Sequence[int], params: SamplingParams, updates: asyncio.Queue, caller: Hashable = None
    ) -> str:
        """Queue a request; its updates will arrive on ``updates`` (several requests may share one queue:
        each `Update` names its request).

        Args:
            prompt, params: as for `halyard.serve.Engine.add_request`.
            updates: where its updates go.
            caller: requests of one caller share a fair share of the engine's rows (default: its own).

        Returns:
            The request's id.

        Raises:
            ParameterError: the engine refused the request (prompt too long, ...).
            EngineUnavailable: the server is shutting down or the engine failed.
        """
        loop = asyncio.get_running_loop()
        accepted = loop.create_future()
        request_id = new_request_id()
        with self._submitting:
            if self._closing or self.failure is not None:
                raise EngineUnavailable(self._unavailable_reason())
            if self._text is not None:
                with self._text_lock:
                    self._text.add(request_id, params.n, params.stop)
            self._commands.put(("add", request_id, list(prompt), params, loop, updates, accepted, caller))
        try:
            await accepted
        except asyncio.CancelledError:
            self.cancel(request_id)  # the caller went away while the engine thread was adding it
            raise
        except BaseException:
            self._forget_text(request_id)
            raise
        return request_id

    def cancel(self, request_id: str) -> None:
        """End a request and free its pages (from any thread; no update of it is delivered after this)."""
        self._forget_text(request_id)
        self._commands.put(("cancel", request_id))

    def _forget_text(self, request_id: str) -> None:
        if self._text is not None:
            with self._text_lock:
                self._text.forget(request_id)

    def drain(self, seconds: float) -> None:
        """Refuse new requests from now on and end those still running after ``seconds`` (their callers
        get `EngineUnavailable`); safe from a signal handler."""
        self._closing = True
        self._commands.put(("drain", time.monotonic() + seconds))

    def stop(self, timeout: float = 30.0) -> None:
        """End every request (their callers get `EngineUnavailable`) and the engine thread."""
        self._closing = True
        if self._thread.is_alive():
            self._commands.put(("stop",))
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        """Whether the engine thread is alive."""
        return self._thread.is_alive()

    def _unavailable_reason(self) -> str:
        if self.failure is not None:
            return f"the engine failed ({type(self.failure).__name__}: {self.failure}); restart the server"
        return "the server is shutting down; retry on another server"

    # -- the engine thread -------------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while self._take_commands(block=not self.engine.has_work):
                if self._drain_deadline is not None and time.monotonic() >= self._drain_deadline:
                    self._end_all()
                if self.engine.has_work:
                    self._deliver(self.engine.step())
                self._publish_stats()
        except BaseException as error:  # a bug in a step: every waiting caller is told, then the thread ends
            logger.exception("the engine failed; every running request is ended")
            self.failure = error
        finally:
            with self._submitting:
                self._closing = True
            self._end_all()
            self._reject_queued()
            self._publish_stats()

    def _take_commands(self, block: bool) -> bool:
        """Run the queued commands (waiting for one when ``block``); False once asked to stop."""
        timeout = None
        if self._drain_deadline is not None:
            timeout = max(0.0, self._drain_deadline - time.monotonic())
        while True:
            try:
                command = self._commands.get(timeout=timeout) if block else self._commands.get_nowait()
            except queue.Empty:
                return True
            block = False
            kind = command[0]
            if kind == "add":
                self._add(*command[1:])
            elif kind == "cancel":
                self._routes.pop(command[1], None)
                self.engine.cancel(command[1])
            elif kind == "stop_sample":
                self.engine.stop_sample(*command[1:])
            elif kind == "drain":
                self._drain_deadline = command[1]
            elif kind == "stop":
                return False

    def _add(
        self,
        request_id: str,
        prompt: list[int],
        params: SamplingParams,
        loop: asyncio.AbstractEventLoop,
        updates: asyncio.Queue,
        accepted: asyncio.Future,
        caller: Hashable,
    ) -> None:
        try:
            self.engine.add_request(prompt, params, request_id, caller=caller)
        except Exception as error:  # ParameterError: the caller answers 400
            _call_soon(loop, _settle, accepted, error)
            return
        self._routes[request_id] = _Route(loop, updates, params.n)
        _call_soon(loop, _settle, accepted, None)

    def _deliver(self, updates: list[Update]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Any]]] = defaultdict(list)
        for update in updates:
            route = self._routes.get(update.request_id)
            if route is None:  # cancelled: nobody waits for it
                continue
            by_loop[route.loop].append((route.updates, update))
            if update.finish_reason is not None:
                route.unfinished -= 1
                if route.unfinished == 0:
                    del self._routes[update.request_id]
        for loop, items in by_loop.items():
            _call_soon(loop, self._put_all, items)

    def _put_all(self, items: list[tuple[asyncio.Queue, Any]]) -> None:
        """On the event loop: give the updates their text, put them on their queues (an update of a
        sample that a stop string already ended is dropped) and ask the engine to stop such samples."""
        if self._text is None:
            _put_all(items)
            return
        queues = {id(update): updates for updates, update in items}
        with self._text_lock:
            shown, stops = self._text.process([update for _, update in items])
        for stop in stops:
            self._commands.put(("stop_sample", *stop))
        _put_all([(queues[id(update)], update) for update in shown])

    def _end_all(self) -> None:
        """Cancel every request still routed; each caller gets `EngineUnavailable`."""
        self._drain_deadline = None
        error = EngineUnavailable(self._unavailable_reason())
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Any]]] = defaultdict(list)
        for request_id, route in list(self._routes.items()):
            by_loop[route.loop].append((route.updates, error))
            self._forget_text(request_id)
            with contextlib.suppress(Exception):  # the engine already failed: its pages no longer matter
                self.engine.cancel(request_id)
        self._routes.clear()
        for loop, items in by_loop.items():
            _call_soon(loop, _put_all, items)

    def _reject_queued(self) -> None:
        """Answer the submissions still queued when the thread ends (their callers would wait forever)."""
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command[0] == "add":
                _call_soon(command[4], _settle, command[6], EngineUnavailable(self._unavailable_reason()))

    def _publish_stats(self) -> None:
        self.stats = {**self.engine.stats.as_dict(), "requests_in_flight": len(self._routes)}


def _call_soon(loop: asyncio.AbstractEventLoop, function: Any, *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # the loop closed (the server stopped): nobody is left to tell
        loop.call_soon_threadsafe(function, *args)


def _settle(future: asyncio.Future, error: BaseException | None) -> None:
    if future.done():  # the caller was cancelled meanwhile
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def _put_all(items: list[tuple[asyncio.Queue, Any]]) -> None:
    for updates, item in items:
        updates.put_nowait(item)
