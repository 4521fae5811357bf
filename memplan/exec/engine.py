"""Copy engines: where swap copies run, behind one small interface.

Two lanes, each FIFO: "d2h" (swap-out) and "h2d" (prefetch). On a GPU a lane is a CUDA
stream and a ticket is a CUDA event. On the CPU, where the "device" is host memory too, a
copy runs at once on the calling thread (`InlineCopyEngine`): handing a copy to a worker
thread costs the host tens of microseconds, far more than a GPU's asynchronous copy costs
its host, and the CPU proxies the GPU's host-bound steps; `ThreadCopyEngine` runs each lane
on a one-thread worker, with Futures as tickets (tests delay the worker to provoke races). A
lane only copies: the step program decides when device memory is freed and allocated, on
the compute side.

NOTE stream safety -- the whole argument, in one place:
 1. A copy reads what the compute stream wrote: before running a job its lane waits for
    the compute stream (CUDA: `lane.wait_stream(compute)`; CPU: ops are synchronous, so
    everything a job reads exists when `submit` is called).
 2. A prefetch writes into memory the compute stream just allocated, possibly a block that
    compute work still queued was using: rule 1 orders the write after that work.
 3. A prefetch reads the host region its swap-out wrote: it is submitted with `after=` the
    swap-out's ticket (CUDA: `wait_event`; CPU: the worker blocks on the Future).
 4. No storage is used before its prefetch landed: the program's wait calls `wait(ticket)`
    (CUDA: the compute stream waits on the event, on the device; CPU: blocks on the Future).
 5. Device memory a swap-out reads is freed only after the copy finished: the program's
    release calls `wait(ticket)` before freeing (CUDA: the compute stream waits for the
    copy's event, on the device, and the host runs on; CPU: blocks on the Future), and so
    does a prefetch that finds the copy not yet released (the storage stays, and the
    framework may free it any time after). A block
    freed on the compute stream goes only to later work of that stream (PyTorch's
    allocators keep per-stream pools; a pool's slots are used by compute-stream work), all
    of it ordered after the copy. A host wait here (`sync`) would drain the device queue
    at every release: the copy's time would add to the step instead of hiding under it.
    Only a compressed copy's release waits on the host, for that copy alone: the host reads
    whether it held every non-zero (memplan.exec.hostcopy), which it has usually long done.
 6. A host region is rewritten by a later swap-out only after the prefetch that read it
    landed: regions are laid out offline over [swap-out, wait] intervals (slab.py), and
    the later swap-out is submitted after the compute side waited (rule 4).
 7. A job holds what it copies only while it runs: a CPU lane drops the job before it
    reports completion, and `cancel` drops a job that has not started (a swap-out whose
    storage stayed resident). Otherwise a storage the framework freed would live on in a
    queued job, memory the program does not have (seen under load: +9% on vgg11).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import torch

log = logging.getLogger(__name__)

LANES = ("d2h", "h2d")


class CopyEngine:
    """Runs copy jobs on side lanes and orders them against the compute stream."""

    def submit(self, lane: str, fn: Callable[[], Any], *, after: Any = None) -> Any:
        """Queue `fn` on `lane` after the compute stream's work so far (and after ticket `after`).

        Returns:
            A ticket for the job's completion.
        """
        raise NotImplementedError

    def wait(self, ticket: Any) -> None:
        """Make the compute stream wait for `ticket` (before using what the job produced)."""
        raise NotImplementedError

    def sync(self, ticket: Any) -> None:
        """Block the host until the job behind `ticket` has finished (before freeing what it reads)."""
        raise NotImplementedError

    def done(self, ticket: Any) -> bool:
        """True when the job behind `ticket` has finished."""
        raise NotImplementedError

    def cancel(self, ticket: Any) -> None:
        """The job's result is not wanted: drop it if it has not started, else let it finish."""
        raise NotImplementedError

    def drain(self) -> None:
        """Block the host until every queued job has completed."""
        raise NotImplementedError

    def close(self) -> None:
        """Drain and release the lanes."""
        self.drain()


class _Job:
    """A queued CPU copy: the function lives here until a worker takes it (see rule 7)."""

    def __init__(self, fn: Callable[[], Any]):
        self.fn: Callable[[], Any] | None = fn
        self.lock = threading.Lock()
        self.future: Future | None = None

    def take(self) -> Callable[[], Any] | None:
        """The function, handed out once (None when cancelled or already taken)."""
        with self.lock:
            fn, self.fn = self.fn, None
        return fn


class ThreadCopyEngine(CopyEngine):
    """CPU engine: one single-thread worker per lane; tickets are `_Job`s.

    Args:
        before_job: called on the worker as `before_job(lane)` before each job; tests use
            it to delay the worker.
    """

    def __init__(self, before_job: Callable[[str], None] | None = None):
        self.before_job = before_job
        self._pools = {lane: ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"memplan-{lane}")
                       for lane in LANES}
        self._last: dict[str, _Job | None] = {lane: None for lane in LANES}

    def submit(self, lane, fn, *, after=None):
        ticket = _Job(fn)

        def run() -> None:
            if after is not None:
                after.future.result()
            if self.before_job is not None:
                self.before_job(lane)
            work = ticket.take()
            if work is not None:
                with torch.no_grad():
                    work()
            # returning drops `work` before the future completes (rule 7)

        ticket.future = self._pools[lane].submit(run)
        self._last[lane] = ticket
        return ticket

    def wait(self, ticket):
        if ticket is not None:
            ticket.future.result()

    def sync(self, ticket):
        if ticket is not None:
            ticket.future.result()

    def done(self, ticket):
        return ticket is None or ticket.future.done()

    def cancel(self, ticket):
        if ticket is not None and ticket.take() is None:
            ticket.future.result()  # started: its reference to the storage ends with it

    def drain(self):
        for lane in LANES:
            if self._last[lane] is not None:
                self._last[lane].future.result()

    def close(self):
        try:
            self.drain()
        finally:
            for pool in self._pools.values():
                pool.shutdown(wait=True)


class InlineCopyEngine(CopyEngine):
    """CPU engine: a copy runs when it is submitted, on the calling thread; tickets are None.

    Every rule holds trivially: a job runs after everything before it and is done when
    `submit` returns."""

    def submit(self, lane, fn, *, after=None):
        with torch.no_grad():
            fn()

    def wait(self, ticket):
        pass

    def sync(self, ticket):
        pass

    def done(self, ticket):
        return True

    def cancel(self, ticket):
        pass

    def drain(self):
        pass


class CudaCopyEngine(CopyEngine):
    """GPU engine: one CUDA stream per lane, CUDA events as tickets.

    Args:
        device: the CUDA device (None: the current one).
        cuda: the CUDA runtime (torch.cuda; on the CPU, memplan.testing.cuda_rules' stand-in, which
            checks CUDA's rules).
    """

    def __init__(self, device: torch.device | str | int | None = None, cuda=torch.cuda):
        self.cuda = cuda
        self.device = torch.device("cuda", cuda.current_device()) if device is None else torch.device(device)
        self._streams = {lane: cuda.Stream(self.device) for lane in LANES}

    def submit(self, lane, fn, *, after=None):
        stream = self._streams[lane]
        stream.wait_stream(self.cuda.current_stream(self.device))  # rules 1 and 2
        if after is not None:
            stream.wait_event(after)  # rule 3
        with self.cuda.stream(stream), torch.no_grad():
            fn()
        event = self.cuda.Event()
        event.record(stream)
        return event

    def wait(self, ticket):
        if ticket is not None:
            self.cuda.current_stream(self.device).wait_event(ticket)  # rule 4

    def sync(self, ticket):
        if ticket is not None:
            ticket.synchronize()  # rule 5

    def done(self, ticket):
        return ticket is None or ticket.query()

    def cancel(self, ticket):
        pass  # a queued stream copy holds no reference; its host copy is simply never read

    def drain(self):
        for stream in self._streams.values():
            stream.synchronize()


def engine_for(device: torch.device | str, before_job: Callable[[str], None] | None = None) -> CopyEngine:
    """The engine for tensors on `device`: CUDA streams on a GPU, inline copies elsewhere (worker
    threads when `before_job` is given)."""
    device = torch.device(device)
    if device.type == "cuda":
        return CudaCopyEngine(device)
    return InlineCopyEngine() if before_job is None else ThreadCopyEngine(before_job=before_job)


def blocked_s(engine: CopyEngine, ticket, wait: Callable) -> float:
    """Run `wait(ticket)` and return how long the host was blocked (0 when already done)."""
    if engine.done(ticket):
        wait(ticket)
        return 0.0
    started = time.perf_counter()
    wait(ticket)
    return time.perf_counter() - started
