"""The stand-in's streams, events and graphs (memplan.testing.cuda_rules checks what they do)."""

from __future__ import annotations

from dataclasses import dataclass, field


class CudaRuleError(RuntimeError):
    """A CUDA rule broken: what a GPU would fail with, or race on."""


class Stream:
    """A stand-in CUDA stream: its work so far (`seq`) and what it has waited for (`clock`)."""

    def __init__(self, rules: "CudaRules", name: str):
        self.rules, self.name = rules, name
        rules.streams.append(self)
        self.seq = 0
        self.clock: dict[Stream, int] = {}
        self.capture: Capture | None = None  # the capture this stream is in

    def wait_event(self, event: "Event") -> None:
        self.rules._wait(self, event)

    def wait_stream(self, stream: "Stream") -> None:
        self.wait_event(stream.record_event())

    def record_event(self, event: "Event | None" = None) -> "Event":
        event = event if event is not None else Event(self.rules)
        event.record(self)
        return event

    def synchronize(self) -> None:
        self.rules._host_sync(f"stream {self.name} synchronize", self._upto())

    def query(self) -> bool:
        self.rules._no_capture(f"stream {self.name} query", self.capture)
        return True

    def _upto(self) -> dict:
        return {**self.clock, self: self.seq}

    def __repr__(self) -> str:
        return f"<stream {self.name}>"


class Event:
    """A stand-in CUDA event: the work it marks, and the capture it was recorded in."""

    def __init__(self, rules: "CudaRules", **_):
        self.rules = rules
        self.marks: dict | None = None
        self.capture: Capture | None = None

    def record(self, stream: Stream | None = None) -> None:
        self.rules._record(self, stream if stream is not None else self.rules.current_stream())

    def wait(self, stream: Stream | None = None) -> None:
        (stream if stream is not None else self.rules.current_stream()).wait_event(self)

    def synchronize(self) -> None:
        self.rules._host_sync("event synchronize", self.marks or {}, self.capture)

    def query(self) -> bool:
        self.rules._no_capture("event query", self.capture)
        return True


@dataclass(eq=False)
class Capture:
    """One stream capture underway."""

    origin: Stream
    pool: tuple
    streams: set = field(default_factory=set)
    broken: str = ""  # the first rule it broke (the capture is invalidated)
    outside: dict = field(default_factory=dict)  # key -> (storage handle, data_ptr): blocks it used from outside its pool
    accesses: dict = field(default_factory=dict)  # (key, lo, hi, write) -> (storage handle, lo, hi, write) on those


class CUDAGraph:
    """A stand-in torch.cuda.CUDAGraph."""

    def __init__(self, rules: "CudaRules"):
        self.rules = rules
        self.capture: Capture | None = None
        self.captured = False
        self.replays = 0

    def capture_begin(self, pool: tuple | None = None, capture_error_mode: str = "global") -> None:
        self.capture = self.rules._begin_capture(pool)

    def capture_end(self) -> None:
        self.rules._end_capture(self.capture)
        self.captured = True

    def replay(self) -> None:
        if not self.captured:
            raise CudaRuleError("Called CUDAGraph::replay without a preceding successful capture.")
        self.rules._replay(self.capture)
        self.replays += 1

    def reset(self) -> None:
        if self.captured:
            self.rules.released_pools.append(self.capture.pool)
        self.captured = False

    def pool(self) -> tuple:
        return self.capture.pool
