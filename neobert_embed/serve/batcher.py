"""Dynamic batching: the inputs of concurrent requests merged into token-budgeted, length-ordered batches.

Why: a forward pass over one short text costs almost as much as over thirty. Waiting inputs are cut by
every command's batching rule (:func:`~neobert_embed.inference.pipeline.plan_batches`); while a batch
runs in the ONE model thread, new requests queue for the next, so under load batches fill by themselves.

Example:
    >>> batcher = DynamicBatcher(engine.forward, max_batch_tokens=16384, max_wait_ms=2, max_queue=4096)
    >>> await batcher.start()
    >>> vectors = await batcher.embed(["a cat", "a dog"], prompt=None, tokens=[4, 4])
    >>> await batcher.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from neobert_embed.inference.pipeline import plan_batches
from neobert_embed.serve.errors import APIError

if TYPE_CHECKING:
    from neobert_embed.serve.metrics import ServeMetrics

#: The model thread's forward: a batch's inputs (as ``embed`` got them) and prompts → float32 vectors.
ForwardFn = Callable[[Sequence[object], Sequence[str | None]], np.ndarray]
PADDED_MIN_FILL = 0.5  # by default a padded model's batch never pads an input to more than twice its length


class QueueFull(APIError):
    """The bounded queue cannot take a request's inputs now; retry after ``retry_after`` seconds."""

    def __init__(self, waiting: int, limit: int, retry_after: int = 1) -> None:
        super().__init__(f"server busy: {waiting} inputs queued (limit {limit}); retry in {retry_after} s",
                         503, "server_busy", {"Retry-After": str(retry_after)})


@dataclass
class _Item:
    tokens: int
    text: object
    prompt: str | None
    future: asyncio.Future


class DynamicBatcher:
    """Merges concurrent ``embed`` calls into token-budgeted batches run by one worker thread."""

    def __init__(self, forward: ForwardFn, *, max_batch_tokens: int = 16384, max_wait_ms: float = 2.0,
                 max_queue: int = 4096, padded: bool = True, min_fill: float | None = None,
                 observer: ServeMetrics | None = None) -> None:
        self.forward, self.observer = forward, observer
        self.max_batch_tokens, self.max_wait_s, self.max_queue = max_batch_tokens, max_wait_ms / 1000.0, max_queue
        self.padded = padded  # False: the model un-pads, so a batch's budget counts its real tokens
        self.min_fill = (PADDED_MIN_FILL if padded else 0.0) if min_fill is None else min_fill
        self.pending = 0  # inputs accepted and not yet answered (queued or being encoded)
        self._waiting: list[_Item] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="neobert-embed-model")

    async def start(self) -> None:
        """Start the batching loop on the running event loop."""
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._loop(), name="neobert-embed-batcher")

    async def stop(self) -> None:
        """Stop the loop (after in-flight requests were answered) and release the worker thread."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for item in self._waiting:
            if not item.future.done():
                item.future.set_exception(RuntimeError("server shutting down"))
        self.executor.shutdown(wait=True)

    async def run_exclusive(self, fn: Callable[[], object]) -> object:
        """Run other model work (e.g. an index's own encoder) on the model thread, in turn with batches."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn)

    async def embed(self, texts: Sequence[object], prompt: str | None, tokens: Sequence[int]) -> np.ndarray:
        """Embed ``texts`` (with ``prompt``; ``tokens[i]`` = input i's token count) as float32 (n, dim);
        :class:`QueueFull` when the queue cannot take them now."""
        if self._wake is None:
            raise RuntimeError("DynamicBatcher.start() was not called")
        if self.pending + len(texts) > self.max_queue:
            raise QueueFull(self.pending, self.max_queue)
        loop = asyncio.get_running_loop()
        items = [_Item(max(1, int(n)), text, prompt, loop.create_future())
                 for text, n in zip(texts, tokens, strict=True)]
        self.pending += len(items)
        self._waiting.extend(items)
        self._report_depth()
        self._wake.set()
        try:
            rows = await asyncio.gather(*(item.future for item in items))
        finally:
            self.pending -= len(items)
        return np.stack(rows) if rows else np.zeros((0, 0), dtype=np.float32)

    def _report_depth(self) -> None:
        if self.observer is not None:
            self.observer.queue_depth(len(self._waiting))

    def _cost(self, items: list[_Item]) -> int:
        """The tokens a batch of ``items`` computes: inputs x longest, or their real tokens when un-padded."""
        lengths = [item.tokens for item in items]
        return len(lengths) * max(lengths, default=0) if self.padded else sum(lengths)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._waiting:
                continue
            deadline = loop.time() + self.max_wait_s
            while self._cost(self._waiting) < self.max_batch_tokens and (remaining := deadline - loop.time()) > 0:
                try:
                    await asyncio.wait_for(self._wake.wait(), remaining)
                except asyncio.TimeoutError:
                    break
                self._wake.clear()
            while self._waiting:  # what waits now; later arrivals wait for the next window (no starving)
                window, self._waiting = self._waiting, []
                self._report_depth()
                for rows in plan_batches([item.tokens for item in window], max_tokens=self.max_batch_tokens,
                                         min_fill=self.min_fill, padded=self.padded):
                    await self._run([window[row] for row in rows], loop)

    async def _run(self, batch: list[_Item], loop: asyncio.AbstractEventLoop) -> None:
        start = time.perf_counter()
        try:
            vectors = await loop.run_in_executor(self.executor, self.forward, [item.text for item in batch],
                                                 [item.prompt for item in batch])
        except Exception as exc:  # the requests in this batch fail; the server goes on
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(exc)
            return
        if self.observer is not None:
            self.observer.batch_done(len(batch), self._cost(batch), time.perf_counter() - start)
        for item, vector in zip(batch, vectors, strict=True):
            if not item.future.done():
                item.future.set_result(vector)
