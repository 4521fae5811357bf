"""The lower bound's linear program (see `memplan.planners.bound` for what it relaxes).

Time in milliseconds, memory in MiB (HiGHS' absolute tolerances far below a nanosecond and a byte).

Columns: per time op j (a check op, a release or a due op) the delay delta_j: how much later op j
starts than without a plan (non-decreasing in j), and delta_end, the step's overhead. Per unit k
and check op i where it may be away: x (away by a swap), y (away by a recomputation), and their
running maxima: z (swapped and away at some op <= i: its copy out is done by i), w (swapped and
away at some op >= i: its copy back starts after i) and r (recomputed and away at some op >= i:
its replay runs after i).

Rows, at every check op i: the load without what is away fits the budget; at every cut op i (a
subset of the check ops): the copies out done by i and started after op v fit between v and i on
the device-to-host lane, for every release op v, and with them those of the heads away at i (their
swap-outs in the previous iteration, after their last access there) that started after op v of the
previous iteration, one step (the plain step's time plus the overhead) before; the copies back
started after i and landed by op v fit between them on the host-to-device lane, for every due op
v; the replays after i fit between i and the step's end. Each lane's sum is a running column over
the release (or due) ops, so that a cut row has three terms. Per op some unit's recomputation replays wherever it runs
(`Absence.replays`), a column rho_j >= r of every such unit at its first op (its share recomputed at
all), and one row: the step ends after the first check op by at least every such op's duration
times rho_j (each op a recomputation needs is replayed once at least, after the first op anything is
away at; the cut rows share an op's replay out by bytes among every storage that counts it, which is
far less where few of them are recomputed).

Where the host's work is priced (`host`: its least work per op, in ms), the device starts no op
before the host has issued it, every op before it and what it issued among them (the simulator's
asynchronous host): at every time op j, its start is at least the host's work up to and including
j, plus the actions of every unit due at j or before (a swap's four actions, out, release, prefetch
and wait, and a recomputation's two, drop and run, all lie between its gap's ends; a head's prefetch
and wait lie before its due op, in the step's head, where it starts away), the runs of the
stretches that end there (below) and the pack hooks that fire there (below), each times its
share; and the step ends no earlier than the host's work for every op, plus the actions of every
storage away at some check op, each times its largest share away that way (the end of its running
maximum) and the fewest storages that share is. A storage's tail and head (after its last access,
before its first) are one swap across the iteration boundary, which acts four times every step:
four times the larger of their shares (merged units, whose members' tails and heads need not pair
up, half of that each). A recomputation's run lies after the check op
it is away at and at or before its due op, so each stretch from one check op to the next where
something recomputed away at the first is due by the next holds a run of its own (and the last
stretch, to the step's end, one where anything is away at the last check op): the step pays a run
for each such stretch, and one at least where any share is recomputed, and the host's work of
issuing again each op replayed once at least (below). Where the plans bounded run hooked
(`host.sites`), moving a storage installs the windows of its packs, whose hooks fire at every pack
and unpack saved inside them (memplan.model.hooksites): a column per such pack, at least the share
moved of every storage alone in its unit that hooks it, pays a hook's call at each of its firings.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from ...model.hooksites import HookSites
from .absences import Absence
from ..kit.linear import MIB, Columns

SWAP_ACTIONS, RECOMPUTE_ACTIONS = 4, 2  # the executor's actions per decision (memplan.sim.simulate)
HEAD_ACTIONS = 2  # ... of a swap across the boundary, in the step's head: its prefetch and its wait


@dataclass(frozen=True)
class HostFloor:
    """The least host work a plan that fits pays: per op, and per action (ms)."""

    per_op_ms: np.ndarray
    action_ms: float
    run_ms: float  # a recomputation's run beyond issuing its ops: a region's work (hooked), an op's dispatch
    # (interpreted), the lesser where the plans bounded run at either level
    replayed_op_ms: float = 0.0  # an op replayed by a recomputation at that level (issued again)
    hook_call_ms: float = 0.0  # a hook's call, where the plans bounded run hooked (`sites` given)
    sites: HookSites | None = None  # the trace's hook sites, where the plans bounded run hooked


class BoundLP:
    """The LP over `units` with memory rows at `check_ops` and lane rows at `cut_ops`."""

    def __init__(self, durations_ms: np.ndarray, excess_bytes: np.ndarray, check_ops: np.ndarray,
                 cut_ops: np.ndarray, units: list[Absence], host: HostFloor | None = None):
        self.c, self.units = Columns(), units
        self.start = np.concatenate([[0.0], np.cumsum(durations_ms)])  # op start times without a plan
        self.durations = durations_ms
        times = set(check_ops.tolist()) | {u.release for u in units if u.release is not None} | \
            {u.due for u in units if u.due is not None} | {u.copied_after for u in units if u.copied_after is not None}
        self.times = sorted(times)
        self.delta = dict(zip(self.times, self.c.add(len(self.times)).tolist()))
        self.end = int(self.c.add(1)[0])
        for a, b in zip(self.times, self.times[1:] + [None]):
            self.c.ge([(self.end if b is None else self.delta[b], 1), (self.delta[a], -1)], 0)
        self._unit_columns()
        self._memory(check_ops, excess_bytes)
        for i in cut_ops.tolist():
            self._cuts(i)
        self.replayed = self._replayed_once(int(check_ops.min())) if len(check_ops) else []
        if host is not None:
            self._host(host, check_ops.tolist())

    def _unit_columns(self) -> None:
        """x, y and their running maxima z, w, r per unit and op (see the module docstring)."""
        c = self.c
        self.x, self.y, self.z, self.w, self.r = [], [], [], [], []
        for u in self.units:
            n = len(u.ops)
            x = c.add(n, ub=1)
            y = c.add(n, ub=u.recompute_share) if u.recompute_share.any() else None
            if y is not None:
                for a, b in zip(x, y):
                    c.le([(a, 1), (b, 1)], 1)
            self.x.append(x)
            self.y.append(y)
            self.z.append(None if u.release is None else self._running(x, forward=True))
            self.w.append(None if u.due is None else self._running(x, forward=False))
            self.r.append(None if y is None else self._running(y, forward=False))

    def _running(self, cols: np.ndarray, forward: bool) -> np.ndarray:
        """Columns m_t >= cols[t] and >= m_(t-1) (forward) or m_(t+1) (backward)."""
        c, out = self.c, self.c.add(len(cols), ub=1)
        for t, (m, v) in enumerate(zip(out, cols)):
            c.ge([(m, 1), (v, -1)], 0)
            prev = t - 1 if forward else t + 1
            if 0 <= prev < len(out):
                c.ge([(m, 1), (out[prev], -1)], 0)
        return out

    def _memory(self, check_ops: np.ndarray, excess_bytes: np.ndarray) -> None:
        rows: dict[int, list] = {int(i): [] for i in check_ops}
        for k, u in enumerate(self.units):
            size = u.nbytes / MIB
            for t, i in enumerate(u.ops.tolist()):
                rows[i].append((self.x[k][t], size))
                if self.y[k] is not None:
                    rows[i].append((self.y[k][t], size))
        for i, terms in rows.items():
            self.c.ge(terms, excess_bytes[i] / MIB)

    def _replayed_once(self, first: int) -> list[tuple[int, int]]:
        """Every op a recomputed unit replays wherever it runs is replayed once at least, after op
        `first` (module docstring); returns (column, op) of each such op."""
        needed: dict[int, list] = {}
        for u, r in zip(self.units, self.r):
            if r is not None:
                for j in u.replays:
                    needed.setdefault(j, []).append(r[0])
        if not needed:
            return []
        replayed = [(self._at_least(needed[j]), j) for j in sorted(needed)]
        self.c.ge([(self.end, 1), (self.delta[first], -1)] + [(col, -float(self.durations[j])) for col, j in replayed],
                  0)
        return replayed

    def _host(self, host: HostFloor, check_ops: list[int]) -> None:
        """The host's rows (module docstring): no op starts before the host issued it and the actions and
        runs issued before it; the step ends after the host's work for every op and the actions and runs
        of what is away."""
        issued = np.cumsum(host.per_op_ms)  # the host's work up to and including each op
        actions, across, before, moved = [], {}, {}, []
        for k, u in enumerate(self.units):
            # its largest share away by a swap and by a recomputation: the running maxima's ends
            swapped = self.z[k][-1] if self.z[k] is not None else self.w[k][0] if self.w[k] is not None \
                else self._running(self.x[k], forward=True)[-1]
            moved.append([swapped] + ([self.r[k][0]] if self.r[k] is not None else []))
            if u.due is not None:  # issued before its due op starts: a swap's four actions, a head's two
                terms = before.setdefault(u.due, [])
                count = SWAP_ACTIONS if u.release is not None else HEAD_ACTIONS
                terms.append((swapped, host.action_ms * u.fewest * count))
                if self.r[k] is not None:
                    terms.append((self.r[k][0], host.action_ms * u.fewest * RECOMPUTE_ACTIONS))
            if u.members == 1 and u.storages and (u.release is None) != (u.due is None):
                across.setdefault(u.storages[0], []).append(swapped)  # a tail or a head: below
            else:  # merged tails and heads: half a swap's actions each (one swap may be both)
                swap = SWAP_ACTIONS if u.release is not None and u.due is not None else SWAP_ACTIONS / 2
                actions.append((swapped, -swap * host.action_ms * u.fewest))
            if self.r[k] is not None:
                actions.append((self.r[k][0], -RECOMPUTE_ACTIONS * host.action_ms * u.fewest))
        for shares in across.values():  # one storage's tail and head: a swap across the boundary is all its
            actions.append((self._at_least(shares), -SWAP_ACTIONS * host.action_ms))  # actions every step
        actions += [(col, -host.replayed_op_ms) for col, _ in self.replayed]  # each issued again at least once
        recomputed = [r[0] for r in self.r if r is not None]
        if recomputed:  # a run in every stretch that must hold one, and one run at least anyway
            runs = self._runs(check_ops)
            for col, last in runs:
                if last is not None:  # issued before the stretch's last op starts
                    before.setdefault(last, []).append((col, host.run_ms))
            every = int(self.c.add(1)[0])
            self.c.ge([(every, 1)] + [(col, -1) for col, _ in runs], 0)
            self.c.ge([(every, 1), (self._at_least(recomputed), -1)], 0)
            actions.append((every, -host.run_ms))
        if host.sites is not None and host.hook_call_ms:
            self._pack_hooks(host, moved, before, actions)
        sums = list(self._running_sums(before, descending=False))
        dues = [v for v, _ in sums]
        for j in self.times:
            at = bisect.bisect_right(dues, j) - 1  # what is issued before op j at the latest
            self.c.ge([(self.delta[j], 1)] + ([(sums[at][1], -1)] if at >= 0 else []), issued[j] - self.start[j])
        n = len(self.durations)
        self.c.ge([(self.end, 1)] + actions, issued[-1] + self.durations[-1] - self.start[n])

    def _pack_hooks(self, host: HostFloor, moved: list, before: dict, actions: list) -> None:
        """The pack and unpack hooks a hooked program installs for what it moves: a column per pack, at least
        the share moved (`moved`: per unit, its largest shares away swapped and recomputed) of every
        storage alone in its unit whose move hooks that pack (memplan.model.hooksites.packs_hooked_for),
        each hook's call issued at its op (`before`) and in the step (`actions`)."""
        hooked: dict[int, list] = {}
        for u, shares in zip(self.units, moved):
            if u.members == 1 and u.storages:
                for pack in host.sites.packs_hooked_for(u.storages[0]).tolist():
                    hooked.setdefault(pack, []).extend(shares)
        for pack, shares in hooked.items():
            col = self._at_least(shares)
            for op in host.sites.pack_firings(pack):
                before.setdefault(op, []).append((col, host.hook_call_ms))
                actions.append((col, -host.hook_call_ms))

    def _runs(self, check_ops: list[int]) -> list[tuple[int, int | None]]:
        """The recomputations' runs every plan makes: (column, op) for each stretch of ops after a check
        op up to the next one (op; None: the step's end) in which some unit recomputed away at the
        stretch's first op is due (its run lies in the stretch: after the op it is away at, at or before
        the one it is due at). The stretches are disjoint, so each holds a run of its own; its column is
        at least each such share."""
        shares: dict[int, list] = {}
        for u, y in zip(self.units, self.y):
            if y is None:
                continue
            for t, i in enumerate(u.ops.tolist()):
                m = bisect.bisect_left(check_ops, i)  # a unit's ops are check ops
                if m + 1 == len(check_ops) or u.due <= check_ops[m + 1]:
                    shares.setdefault(m, []).append(y[t])
        return [(self._at_least(cols), check_ops[m + 1] if m + 1 < len(check_ops) else None)
                for m, cols in sorted(shares.items())]

    def _at_least(self, cols: list) -> int:
        """`cols[0]` where it is the only one, else a column at least each of `cols` (at most 1: they are
        shares; the LP, paying for it, takes their largest)."""
        if len(cols) == 1:
            return cols[0]
        out = int(self.c.add(1, ub=1)[0])
        for col in cols:
            self.c.ge([(out, 1), (col, -1)], 0)
        return out

    def _cuts(self, i: int) -> None:
        """The lane and replay rows at cut op i."""
        out, back, replay, heads = {}, {}, {}, {}
        for k, u in enumerate(self.units):
            if u.copied_after is not None:  # a head: its share away at i, where it has one
                at = int(np.searchsorted(u.ops, i))
                if at < len(u.ops) and u.ops[at] == i:
                    heads.setdefault(u.copied_after, []).append((self.x[k][at], u.d2h_ms))
            if u.release is not None and u.ops[0] <= i:
                t = int(np.searchsorted(u.ops, i, side="right")) - 1
                out.setdefault(u.release, []).append((self.z[k][t], u.d2h_ms))
            if u.ops[-1] >= i:
                t = int(np.searchsorted(u.ops, i, side="left"))
                if u.due is not None:
                    back.setdefault(u.due, []).append((self.w[k][t], u.h2d_ms))
                if self.r[k] is not None:
                    replay.setdefault(u.due, []).append((self.r[k][t], float(u.recompute_ms[t])))
        d_i = self.delta[i]
        every_out = []
        for v, total in self._running_sums(out, descending=True):  # copies out in [start of v, start of i]
            self.c.ge([(d_i, 1), (self.delta[v], -1), (total, -1)], -(self.start[i] - self.start[v]))
            every_out = [(total, -1)]
        # Heads away at i, copied out after op v of the previous iteration (one step earlier: the plain
        # step's time plus the overhead), and every copy out of this one done by i, in between.
        step = self.start[len(self.durations)]
        for v, total in self._running_sums(heads, descending=True):
            self.c.ge([(d_i, 1), (self.end, 1), (self.delta[v], -1), (total, -1)] + every_out,
                      -(self.start[i] + step - self.start[v]))
        for v, total in self._running_sums(back, descending=False):  # copies back in [end of i, start of v]
            self.c.ge([(self.delta[v], 1), (d_i, -1), (total, -1)], -(self.start[v] - self.start[i + 1]))
        for v, total in self._running_sums(replay, descending=False):  # replays after i, before v starts
            self.c.ge([(self.delta[v], 1), (d_i, -1), (total, -1)], 0)

    def _running_sums(self, terms: dict, descending: bool):
        """(op, column) pairs: the column is at least the sum of the terms of every op from there on
        (descending: at or after it; else at or before it)."""
        previous = None
        for v in sorted(terms, reverse=descending):
            col = int(self.c.add(1)[0])
            self.c.ge([(col, 1)] + ([(previous, -1)] if previous is not None else []) +
                      [(z, -coef) for z, coef in terms[v]], 0)
            previous = col
            yield v, col
