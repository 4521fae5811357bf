"""Copy engines: where swap copies run, behind one small interface.

Two lanes, each FIFO: "d2h" (swap-out) and "h2d" (prefetch). On a GPU a lane is a CUDA
stream and a ticket is a CUDA event; on CPU a lane is a one-thread worker and a ticket is
a Future (tests delay the worker to provoke races).

NOTE stream safety -- the whole argument, in one place:
 1. A copy reads what the compute stream wrote: before running a job, its lane waits
    for the compute stream (CUDA: `lane.wait_stream(compute)`; CPU: ops are synchronous,
    so everything the job reads exists when `submit` is called).
 2. No buffer is reused while a copy still reads or writes it: every tensor a job touches
    is passed in `keep`; CUDA calls `t.record_stream(lane)` so the caching allocator
    will not hand its block out before the lane's work queued so far has completed; the
    CPU worker holds a reference until the job has run.
 3. A prefetch writes into a block the compute stream allocated, possibly one that
    compute work still queued was using: rule 1 (the lane waits for compute) orders the
    write after that work.
 4. A prefetch reads the host region its swap-out wrote: the h2d job is submitted with
    `after=` the d2h ticket (CUDA: `wait_event`; CPU: the worker blocks on the Future).
 5. No tensor is used before its prefetch landed: the consumer calls `wait(ticket)`
    (CUDA: the compute stream waits on the event, device-side; CPU: blocks on the Future).
 6. A host region is rewritten only after every copy reading it finished: the slab
    recycles space only once all its entries were released (each after its consumer
    waited, rule 5), and then `fence("d2h", "h2d")` orders later swap-outs after every
    prefetch queued so far. A storage swap's fixed region (storage_swap.py) is rewritten
    by its next swap-out only, which is submitted after the compute stream waited for
    the previous prefetch out of it (rule 5), and the lane waits for the compute stream
    (rule 1).
 7. Device memory a swap-out reads is freed through `release` (storage swaps resize the
    storage to zero bytes): CUDA calls it right after `record_stream` (rule 2), so the
    caching allocator hands the block out again only once the lane has passed the copy;
    the CPU worker calls it after the job, and `released(ticket)` blocks the host until
    then, so a prefetch never re-allocates the storage while the worker still reads or
    frees it.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import torch

log = logging.getLogger(__name__)

LANES = ("d2h", "h2d")


class CopyEngine:
    """Runs copy jobs on side lanes and orders them against the compute stream."""

    def submit(self, lane: str, fn: Callable[[], Any], *, keep: tuple = (), after: Any = None,
               release: Callable[[], None] | None = None) -> Any:
        """Queue `fn` on `lane` after the compute stream (and after ticket `after`).

        Args:
            lane: "d2h" or "h2d".
            fn: the job; it runs with the lane current (CUDA) or on the worker (CPU).
            keep: tensors the job reads or writes; protected until it completes.
            after: a ticket the job must wait for first.
            release: frees device memory the job reads, called as soon as that is safe
                (rule 7).
        Returns:
            A ticket for the job's completion.
        """
        raise NotImplementedError

    def released(self, ticket: Any) -> None:
        """Block the host until the `release` of the job behind `ticket` has run (rule 7)."""
        raise NotImplementedError

    def wait(self, ticket: Any) -> None:
        """Make the compute stream wait for `ticket` (before using what the job produced)."""
        raise NotImplementedError

    def fence(self, waiter: str, on: str) -> None:
        """Order all later jobs of lane `waiter` after every job queued on lane `on`."""
        raise NotImplementedError

    def drain(self) -> None:
        """Block the host until every queued job has completed."""
        raise NotImplementedError

    def close(self) -> None:
        """Drain and release the lanes."""
        self.drain()


class ThreadCopyEngine(CopyEngine):
    """CPU engine: one single-thread worker per lane.

    Args:
        before_job: called on the worker as `before_job(lane)` before each job; tests use
            it to delay or gate the worker.
    """

    def __init__(self, before_job: Callable[[str], None] | None = None):
        self.before_job = before_job
        self._pools = {lane: ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"memplan-{lane}")
                       for lane in LANES}
        self._last: dict[str, Future | None] = {lane: None for lane in LANES}
        self._barrier: dict[str, Future | None] = {lane: None for lane in LANES}

    def submit(self, lane, fn, *, keep=(), after=None, release=None):
        held = [keep]  # the worker owns these references until the job has run (rule 2)
        waits = [f for f in (after, self._barrier[lane]) if f is not None]

        def job():
            try:
                for fut in waits:
                    fut.result()
                if self.before_job is not None:
                    self.before_job(lane)
                with torch.no_grad():
                    result = fn()
            finally:
                held.clear()
            if release is not None:
                release()  # rule 7: the copy has read everything (never after a failed copy)
            return result

        fut = self._pools[lane].submit(job)
        self._last[lane] = fut
        return fut

    def wait(self, ticket):
        if ticket is not None:
            ticket.result()

    def released(self, ticket):
        if ticket is not None:
            ticket.result()

    def fence(self, waiter, on):
        self._barrier[waiter] = self._last[on]

    def drain(self):
        for lane in LANES:
            if self._last[lane] is not None:
                self._last[lane].result()

    def close(self):
        try:
            self.drain()
        finally:
            for pool in self._pools.values():
                pool.shutdown(wait=True)


class CudaCopyEngine(CopyEngine):
    """GPU engine: one CUDA stream per lane, CUDA events as tickets."""

    def __init__(self, device: torch.device | str | int | None = None):
        self.device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        self._streams = {lane: torch.cuda.Stream(self.device) for lane in LANES}

    def submit(self, lane, fn, *, keep=(), after=None, release=None):
        stream = self._streams[lane]
        stream.wait_stream(torch.cuda.current_stream(self.device))  # rules 1 and 3
        if after is not None:
            stream.wait_event(after)  # rule 4
        with torch.cuda.stream(stream), torch.no_grad():
            fn()
        for t in keep:
            t.record_stream(stream)  # rule 2
        if release is not None:
            release()  # rule 7: the allocator now reuses the block only after the lane's copy
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def wait(self, ticket):
        if ticket is not None:
            torch.cuda.current_stream(self.device).wait_event(ticket)  # rule 5

    def released(self, ticket):
        pass  # release ran on the host inside submit

    def fence(self, waiter, on):
        self._streams[waiter].wait_stream(self._streams[on])  # rule 6

    def drain(self):
        for stream in self._streams.values():
            stream.synchronize()


def engine_for(device: torch.device | str, before_job: Callable[[str], None] | None = None) -> CopyEngine:
    """The engine for tensors on `device`: CUDA streams on a GPU, threads elsewhere."""
    device = torch.device(device)
    if device.type == "cuda":
        return CudaCopyEngine(device)
    return ThreadCopyEngine(before_job=before_job)
