"""The simulator against a plain-Python reference written here, independently of its code.

The reference re-states the contract of `memplan.sim.simulate` as directly as possible
(dicts of resident storages, a list of swap-outs in flight, loads recomputed by summing)
for plans without wrap-around gaps or recomputes that must rebuild an input first, and
random plans on chain traces must give the same times, stalls, peaks, link and host bytes,
and the same infeasible op and shortfall. Plans on the random DAGs also decide their
convolution ops: a decided op runs for its kernels' summed times and holds their largest
temporary (workspace plus accumulator) from its outputs' allocation to its end, also
while a recomputation replays it.
"""

import random

import pytest

from memplan.budget import NO_LIMIT
from memplan.cost.model import Cost
from memplan.model import ConvParams, Decision, MicroBatch, Plan
from memplan.sim.simulate import Simulator
from memplan.testing.synthetic import chain_trace
from memplan.model import Op, Storage, Trace

MIB = 2**20


class _Infeasible(Exception):
    def __init__(self, op, shortfall):
        super().__init__(op, shortfall)
        self.op, self.shortfall = op, shortfall


class Reference:
    """One iteration, op by op, exactly as the contract's steps (1)-(6) read."""

    def __init__(self, trace, cost, plan, budget):
        self.trace, self.cost, self.budget = trace, cost, budget
        self.decisions = list(plan.decisions)
        self.t = 0.0
        self.resident = {}  # storage id -> bytes on the device
        self.in_flight = []  # (end time, bytes) of swap-outs still copying
        self.peak = 0
        self.stall = dict(memory=0.0, prefetch=0.0, sync=0.0, recompute=0.0)
        self.d2h_free = self.h2d_free = 0.0
        self.on_host = {}  # decision index -> time its swap-out reached the host
        self.land = {}  # decision index -> time its prefetch landed
        self.host_events = []  # (time, +-bytes)
        self.link = 0
        self.durations = list(cost.durations)
        self.temp = {}  # op -> temporary bytes of its conv kernels
        for m in plan.microbatches:
            self.durations[m.op] = 0.0
        for m in plan.microbatches:
            self.durations[m.op] += m.time_s
            self.temp[m.op] = max(self.temp.get(m.op, 0), m.workspace_bytes + m.accumulator_bytes)

    def load(self):
        return sum(self.resident.values()) + sum(b for _, b in self.in_flight)

    def alloc(self, sid, nbytes, op):
        self.in_flight = [(e, b) for e, b in self.in_flight if e > self.t]
        while self.budget is not None and self.load() + nbytes > self.budget:
            if not self.in_flight:
                raise _Infeasible(op, self.load() + nbytes - self.budget)
            first = min(e for e, _ in self.in_flight)
            self.stall["memory"] += max(0.0, first - self.t)
            self.t = max(self.t, first)
            self.in_flight = [(e, b) for e, b in self.in_flight if e > self.t]
        self.resident[sid] = self.resident.get(sid, 0) + nbytes
        self.peak = max(self.peak, self.load())

    def run(self):
        trace = self.trace
        for s in trace.storages:
            if s.alloc_op == 0 and s.free_op > 0:
                self.alloc(s.id, s.nbytes, 0)
        for i in range(len(trace.ops)):
            self.step(i)
        # the compute stream waits for the swap-outs still copying (released at the step's end)
        last = max((end for end, _ in self.in_flight), default=0.0)
        if last > self.t:
            self.stall["sync"] += last - self.t
            self.t = last
        return self.t

    def step(self, i):
        trace, cost, nbytes = self.trace, self.cost, self.trace.nbytes
        for k, d in enumerate(self.decisions):  # (1) prefetches triggered here
            if d.action == "swap" and d.prefetch_at == i:
                self.alloc(d.storage, int(nbytes[d.storage]), i)
                link = self._link(d)
                start = max(self.t, self.h2d_free, self.on_host[k])
                self.land[k] = self.h2d_free = start + cost.h2d_s(link)
                self.host_events.append((self.land[k], -link))
                self.link += link
        rebuilt = sorted((trace.producer(d.storage), k) for k, d in enumerate(self.decisions)
                         if d.action == "recompute" and d.back_before == i)
        read = {r for _, k in rebuilt for r in trace.lineage(self.decisions[k].storage, i)[1]}
        first = [k for k, d in enumerate(self.decisions) if d.action == "swap" and d.back_before == i
                 and d.storage in read]
        for k in first:  # (2) prefetches a recomputation reads land first
            self._land(k)
        for _, k in rebuilt:  # then the recomputes, each replayed conv holding its temporary meanwhile
            d = self.decisions[k]
            ops = trace.lineage(d.storage, i)[0]
            temp = max((self.temp.get(o, 0) for o in ops), default=0)
            self.alloc(d.storage, int(nbytes[d.storage]) + temp, i)
            chain = sum(self.durations[o] for o in ops)
            self.t += chain
            self.stall["recompute"] += chain
            self.resident[d.storage] -= temp
        born = [s for s in trace.storages if s.alloc_op == i and i > 0 and s.free_op > s.alloc_op]
        if born or self.temp.get(i):  # (3) new outputs and the conv kernels' temporary
            self.alloc(-1 - i, sum(s.nbytes for s in born) + self.temp.get(i, 0), i)
            del self.resident[-1 - i]
            for s in born:
                self.resident[s.id] = s.nbytes
        for k, d in enumerate(self.decisions):  # (4) wait for the other prefetches, decompress
            if d.action == "swap" and d.back_before == i and k not in first:
                self._land(k)
        op_start = self.t
        self.t += self.durations[i]  # (5); the temporary was never added to `resident`: released now
        for k, d in enumerate(self.decisions):  # (6) swap-outs, recompute drops, then frees
            if d.out_after != i:
                continue
            size = self.resident.pop(d.storage)
            if d.action == "recompute":
                continue
            self._kernel(d)
            link = self._link(d)
            began = op_start if d.overlap and not d.compress_ratio else self.t  # a copy beside op i
            start = max(began, self.d2h_free)
            self.on_host[k] = self.d2h_free = start + cost.d2h_s(link)
            self.host_events.append((start, link))
            self.link += link
            if d.sync:
                self.stall["sync"] += max(0.0, self.d2h_free - self.t)
                self.t = max(self.t, self.d2h_free)
            else:
                self.in_flight.append((self.d2h_free, size))
        for s in trace.storages:
            if s.free_op == i + 1:
                self.resident.pop(s.id, None)

    def _land(self, k):
        self.stall["prefetch"] += max(0.0, self.land[k] - self.t)
        self.t = max(self.t, self.land[k])
        self._kernel(self.decisions[k])

    def _link(self, d):
        size = int(self.trace.nbytes[d.storage])
        return size if d.compress_ratio is None else int(round(size * d.compress_ratio))

    def _kernel(self, d):
        if d.compress_ratio is not None:
            seconds = self.cost.memory_pass_s(int(self.trace.nbytes[d.storage]))
            self.t += seconds
            self.stall["recompute"] += seconds

    def host_peak(self):
        held = best = 0
        for _, delta in sorted(self.host_events):  # releases (negative) first at equal times
            held += delta
            best = max(best, held)
        return best


def _gaps(acc, rng):
    """One or two disjoint gaps (out_after, back_before) between accesses, at least 2 ops long."""
    pairs = [(a, b) for a, b in zip(acc, acc[1:]) if b - a >= 2]
    rng.shuffle(pairs)
    return sorted(pairs[: rng.choice((1, 1, 2))])


def _random_plan(trace, rng):
    decisions = []
    for sid, acc in enumerate(trace.accesses):
        if trace.storages[sid].persistent or rng.random() < 0.4:
            continue
        for out_after, back in _gaps(acc, rng):
            if trace.recomputable(sid) and rng.random() < 0.3:
                decisions.append(Decision(storage=sid, action="recompute", out_after=out_after, back_before=back))
            else:
                decisions.append(Decision(
                    storage=sid, action="swap", out_after=out_after, back_before=back,
                    trigger=rng.randrange(out_after + 1, back + 1), sync=rng.random() < 0.2,
                    overlap=sid not in trace.ops[out_after].writes and rng.random() < 0.3,
                    compress_ratio=rng.choice((None, None, None, 0.5))))
    return Plan(decisions=tuple(_no_recursive_chains(trace, decisions)), microbatches=_random_microbatches(trace, rng))


def _random_microbatches(trace, rng):
    """Decide every kernel of a random half of the conv ops: random splits, times and temporaries."""
    out = []
    for op in trace.ops:
        if op.conv is None or rng.random() < 0.5:
            continue
        for kernel in op.conv.kernels:
            sizes, left = [], op.conv.n
            while left:
                sizes.append(rng.randint(1, left))
                left -= sizes[-1]
            out.append(MicroBatch(op=op.index, kernel=kernel, sizes=tuple(sizes), algos=("a",) * len(sizes),
                                  time_s=rng.choice((1e-4, 1e-3, 1e-2)), workspace_bytes=rng.randrange(0, 64) * MIB,
                                  accumulator_bytes=rng.choice((0, MIB))))
    return tuple(out)


def _no_recursive_chains(trace, decisions):
    """Drop recomputes whose chain input is recomputed away or freed at that op (the reference
    does not rebuild inputs)."""
    away = [(d.storage, d.out_after, d.back_before) for d in decisions if d.action == "recompute"]
    kept = []
    for d in decisions:
        if d.action == "recompute":
            inputs = trace.lineage(d.storage, d.back_before)[1]
            if any(s in inputs and lo < d.back_before < hi for s, lo, hi in away) \
                    or any(trace.storages[s].free_op <= d.back_before for s in inputs):
                continue
        kept.append(d)
    return kept


def _random_trace(rng):
    """A random DAG: each op writes a new storage and reads a few earlier ones, often far back
    (so storages have several gaps: multi-swap); two inputs exist from the start."""
    n = rng.randrange(8, 30)
    writes = {0: 0, 1: 0}  # storage -> writing op (inputs count as written at op 0)
    reads = [[] for _ in range(n)]
    for i in range(n):
        live = list(writes)
        reads[i] = rng.sample(live, min(len(live), rng.randrange(1, 4)))
        writes[len(writes)] = i
    storages = []
    for sid, op in writes.items():
        last = max([i for i in range(n) if sid in reads[i]] + [op])
        storages.append(Storage(id=sid, nbytes=rng.randrange(1, 512) * MIB, kind="input" if sid < 2 else "activation",
                                alloc_op=0 if sid < 2 else op, free_op=last + 1))
    ops = tuple(Op(index=i, name=f"op{i}", phase="forward", reads=tuple(reads[i]), writes=(i + 2,),
                   duration_s=rng.choice((1e-4, 1e-3, 1e-2)), conv=_random_conv(rng)) for i in range(n))
    return Trace(storages=tuple(storages), ops=ops)


def _random_conv(rng):
    """A third of the ops are convolutions (forward, or one or both backward kernels)."""
    if rng.random() < 2 / 3:
        return None
    kernels = rng.choice((("fwd",), ("bwd_data",), ("bwd_filter",), ("bwd_data", "bwd_filter")))
    return ConvParams(kernels=kernels, n=rng.randrange(1, 9), c=8, h=16, w=16, k=8, r=3, s=3)


def _random_case(seed):
    rng = random.Random(seed)
    if seed % 2:
        n = rng.randrange(3, 10)
        trace = chain_trace(n, sizes=[rng.randrange(1, 256) * MIB for _ in range(n)],
                            flops_per_layer=rng.choice((1e9, 2e10, 2e11)))
    else:
        trace = _random_trace(rng)
    return rng, trace


@pytest.mark.parametrize("seed", range(8))
def test_random_plans_match_the_reference(seed):
    rng, trace = _random_case(seed)
    cost = Cost.for_trace(trace, rng.choice(("v100", "h100", "gtx1080ti")))
    sim = Simulator(trace, cost)
    for _ in range(25):
        plan = _random_plan(trace, rng)
        budget = rng.choice((NO_LIMIT, int(trace.peak_load_bytes * rng.uniform(0.3, 1.1))))
        ref = Reference(trace, cost, plan, budget)
        got = sim.run(plan, budget)
        try:
            time_s = ref.run()
        except _Infeasible as exc:
            assert (got.feasible, got.infeasible_op, got.shortfall_bytes) == (False, exc.op, exc.shortfall)
            continue
        assert got.feasible
        assert got.time_s == pytest.approx(time_s, rel=1e-12)
        assert got.peak_load_bytes == ref.peak
        assert got.link_bytes == ref.link
        assert got.host_peak_bytes == ref.host_peak()
        for key, mine in (("memory_stall_s", "memory"), ("prefetch_stall_s", "prefetch"),
                          ("sync_stall_s", "sync"), ("recompute_s", "recompute")):
            assert got.breakdown[key] == pytest.approx(ref.stall[mine], rel=1e-9, abs=1e-15)
