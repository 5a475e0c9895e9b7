"""`Generation`: the engine requests behind one HTTP request (one per prompt, ``n`` samples each), their
updates as one stream, and their cancellation when the client goes away."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from typing import TypeVar

from fastapi import Request

from halyard.serve.outputs import RequestOutput, SampleOutput, Update
from halyard.serve.params import ParameterError, SamplingParams
from halyard.serve.server.driver import AsyncEngine, EngineUnavailable
from halyard.serve.server.errors import APIError, parameter_error

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before its answer was ready (its requests are cancelled; nobody reads the
    answer)."""


def unavailable(error: EngineUnavailable) -> APIError:
    """The 503 of a request the server cannot finish."""
    return APIError(str(error), status=503, code="unavailable", kind="server_error")


class Generation:
    """The engine requests of one HTTP request.

    Args:
        driver: the engine's driver.
        prompts: token ids of each prompt.
        params: the settings of every prompt.
        renamed: engine parameter names -> the request's (``prompt`` -> ``messages`` for a chat), for
            the errors the engine raises.
    """

    def __init__(
        self,
        driver: AsyncEngine,
        prompts: Sequence[list[int]],
        params: SamplingParams,
        renamed: Mapping[str, str] | None = None,
    ):
        self.driver = driver
        self.prompts = list(prompts)
        self.params = params
        self.renamed = dict(renamed or {})
        self.queue: asyncio.Queue = asyncio.Queue()
        self.prompt_of: dict[str, int] = {}
        self._unfinished: dict[str, int] = {}

    async def start(self) -> None:
        """Submit every prompt.

        Raises:
            APIError: 400 when the prompts' samples together exceed the engine's ``max_n`` or the engine
                refuses a prompt (naming the parameter; none of the prompts then runs), 503 when the server
                is shutting down.
        """
        limit = self.driver.engine.config.max_n
        if len(self.prompts) > 1 and len(self.prompts) * self.params.n > limit:
            raise APIError(
                f"n: {len(self.prompts)} prompts of n={self.params.n} samples ask for "
                f"{len(self.prompts) * self.params.n} samples, more than this server's limit of {limit} per "
                "request; send fewer prompts or a lower n",
                "n",
            )
        caller = object()  # the prompts of one HTTP request share one fair share of the rows
        try:
            for index, prompt in enumerate(self.prompts):
                request_id = await self.driver.submit(prompt, self.params, self.queue, caller)
                self.prompt_of[request_id] = index
                self._unfinished[request_id] = self.params.n
        except ParameterError as error:
            self.cancel()
            raise parameter_error(error, self.renamed) from None
        except EngineUnavailable as error:
            self.cancel()
            raise unavailable(error) from None
        except BaseException:
            self.cancel()
            raise

    async def updates(self) -> AsyncIterator[tuple[int, Update]]:
        """``(prompt index, update)`` until every sample of every prompt has finished.

        Raises:
            APIError: 503 when the server ended the requests (shutdown, engine failure).
        """
        while self._unfinished:
            item = await self.queue.get()
            if isinstance(item, EngineUnavailable):
                self._unfinished.clear()
                raise unavailable(item)
            if item.finish_reason is not None:
                left = self._unfinished[item.request_id] - 1
                if left:
                    self._unfinished[item.request_id] = left
                else:
                    del self._unfinished[item.request_id]
            yield self.prompt_of[item.request_id], item

    async def outputs(self) -> list[RequestOutput]:
        """Every prompt's whole output, in prompt order."""
        outputs = [
            RequestOutput(request_id, self.prompts[index], [SampleOutput(i) for i in range(self.params.n)])
            for request_id, index in sorted(self.prompt_of.items(), key=lambda item: item[1])
        ]
        async for index, update in self.updates():
            outputs[index].apply(update)
        return outputs

    def cancel(self) -> None:
        """Cancel the requests that have not finished (their pages are freed at once)."""
        for request_id in self._unfinished:
            self.driver.cancel(request_id)
        self._unfinished.clear()


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """``await work``, cancelled if the client disconnects first (then raises `ClientGone`)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        task.cancel()
        raise ClientGone()
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
