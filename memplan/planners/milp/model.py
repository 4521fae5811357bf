"""The keep/swap/recompute MILP over a LayerProblem (see `memplan.planners.milp` for what it
models and what it approximates).

Units: time in milliseconds, memory in MiB, so that HiGHS' absolute tolerances (1e-7) are far
below a nanosecond and a byte.

Variables, per unit k: s_k (swap), r_k (recompute), binary, at most one per group; F_k and G_k, when its
device-to-host and host-to-device copies end; u_kq (released by position q) and v_kq
(prefetch issued by position q), binary and non-decreasing in q over its release and trigger
windows. Per position i: t_i (its ops may start: the previous segment is done) and o_i (its
first op starts: after recomputation and prefetch waits). Per recompute point p and node x:
z_px (x is rebuilt before p), per replayed op j: w_pj (j runs again), and the largest
replayed op's discarded outputs. The objective is the overhead: the end of the last segment
minus the baseline.

A wrap-around unit (a weight or optimizer state away across the iteration boundary) is
released in the tail after out_after and prefetched in the head up to back_before (it starts
the iteration on the host, as the simulator's steady state has it); its prefetch cannot start
before the previous iteration's swap-out reached the host: G_k + T >= F_k + h2d, T the
iteration time. Every swap-out but a carried one is done by the step's end (the step waits for it
there). A carried unit (`Unit.carried`: it leaves after the step's last op) is copied at the start
of the step, before the step's own swap-outs on the device-to-host lane (F_k in the step's time),
and holds its bytes until it is released in the head, by its prefetch at the latest.
"""

from __future__ import annotations

import itertools

import numpy as np

from ..kit.linear import MIB, MS, Columns
from ..kit.prefetch import issue_key
from .columns import Model
from .host import HostPrice, add_host_rows
from .layers import LayerProblem
from .windows import Windows


def build(problem: LayerProblem, budget_bytes: int, window: int, forbidden=(), host: HostPrice | None = None) -> Model:
    """The MILP of `problem` under `budget_bytes`.

    Args:
        problem: the layer view.
        budget_bytes: the memory cap.
        window: positions a swap may be released and prefetched at (the first and the last
            of its gap); 0 for the whole gap.
        forbidden: (feature map, action) pairs the model may not choose.
        host: the host's prices, where the cost model has them (memplan.planners.milp.host).
    """
    m = Model(problem=problem, cols=Columns())
    _Builder(m, budget_bytes, window, set(forbidden), host).build()
    return m


class _Builder:
    """Adds the variables and constraints of one Model (see the module docstring)."""

    def __init__(self, model: Model, budget_bytes: int, window: int, forbidden: set, host: HostPrice | None):
        self.m, self.p, self.c, self.host = model, model.problem, model.cols, host
        self.budget, self.forbidden = budget_bytes, forbidden
        self.windows = Windows(self.p, budget_bytes, window)
        p = self.p
        self.need = sorted(range(len(p.units)), key=lambda k: issue_key(p.units[k]))
        # Longer than any schedule: every copy and every possible replay after the baseline.
        replays = sum(float(p.op_s[list(rb.transient)].sum()) for rb in p.rebuilds.values())
        self.big_m = MS * (p.baseline_s + sum(u.d2h_s + u.h2d_s for u in p.units) + replays) + 1.0

    def build(self) -> None:
        """Variables, then time, copy lanes, recomputation, memory and the objective."""
        m, c, p = self.m, self.c, self.p
        n_units, n_pos = len(p.units), len(p.positions)
        m.s = c.add(n_units, ub=1, integer=True)
        m.r = c.add(n_units, ub=1, integer=True)
        m.members = p.groups()
        for group, members in m.members.items():
            c.le([(m.s[k], 1) for k in members] + [(m.r[group], 1)], 1)
        for k, u in enumerate(p.units):
            if not u.recomputable:
                c.ub[m.r[k]] = 0
            for action, col in (("swap", m.s[k]), ("recompute", m.r[k])):
                if (k, action) in self.forbidden:
                    c.ub[col] = 0
        self.t, self.o = c.add(n_pos), c.add(n_pos)
        c.ub[self.t[0]] = 0
        self.F, self.G = c.add(n_units), c.add(n_units)
        self.overhead = c.add(1)[0]
        self._windows()
        self._recompute()
        self._compute_stream()
        self._lanes()
        self._memory()
        self._lane_cuts()
        if self.host is not None:
            add_host_rows(self, self.host)
        m.objective = np.zeros(len(c.lb))
        m.objective[self.overhead] = 1.0

    # --- swap windows ------------------------------------------------------------------------------

    def _windows(self) -> None:
        """Trigger (v) and release (u, and l where a position has a pre-phase) columns per feature map.

        v_kq: the prefetch was issued at or before q. u_kq: the swap-out was released before q's
        pre-phase (its prefetches and recomputations); l_kq: released at q, after its pre-phase,
        before its op. Both non-decreasing over the positions of the unit's windows
        (memplan.planners.milp.windows).
        """
        m, c, w = self.m, self.c, self.windows
        gaps = {k: w.gap(k) for k in range(len(self.p.units))}
        triggers = {k: w.triggers(k, trig) for k, (_, trig) in gaps.items()}
        for k, positions in triggers.items():
            m.triggers[k] = self._cumulative(positions, m.s[k])
            c.eq([(m.triggers[k][-1][1], 1), (m.s[k], -1)], 0)  # issued by back_before at the latest
        self.two_phase = {self.p.position_of(op) for op in self.p.rebuilds} | \
            {q for k in gaps for q, _ in m.triggers[k]}
        self.release = {k: self._releases(w.releases(k, rel, triggers[k]), m.s[k]) for k, (rel, _) in gaps.items()}
        for k in (k for k, u in enumerate(self.p.units) if u.carried):  # released by its prefetch at the latest
            for q, col in m.triggers[k]:
                c.le([(col, 1)] + [(r, -coef) for r, coef in self._released(k, q, late=False)], 0)

    def _cumulative(self, positions, s_col) -> list[tuple[int, int]]:
        cols = self.c.add(len(positions), ub=1, integer=True)
        for a, b in itertools.pairwise(cols):
            self.c.ge([(b, 1), (a, -1)], 0)
        self.c.le([(cols[-1], 1), (s_col, -1)], 0)
        return list(zip(positions.tolist(), cols.tolist()))

    def _releases(self, positions, s_col) -> list[tuple[int, int, int | None]]:
        c, out = self.c, []
        if not len(positions):  # a wrap-around unit leaving after the last position: held to the end
            return out
        for q in positions.tolist():
            u = int(c.add(1, ub=1, integer=True)[0])
            late = int(c.add(1, ub=1, integer=True)[0]) if q in self.two_phase else None
            if out:
                _, u_before, late_before = out[-1]
                c.ge([(u, 1), (u_before, -1)] + ([(late_before, -1)] if late_before is not None else []), 0)
            out.append((q, u, late))
        _, u, late = out[-1]
        c.le([(u, 1), (s_col, -1)] + ([(late, 1)] if late is not None else []), 0)
        return out

    def _released(self, k: int, q: int, late: bool) -> list[tuple[int, float]]:
        """Columns whose sum says feature map k's swap-out is released at position q: before its
        pre-phase, or (late) also before its op."""
        terms = []
        for pos, u, l_col in self.release[k]:
            if pos > q:
                break
            terms = [(u, 1.0)] + ([(l_col, 1.0)] if l_col is not None and (late or pos < q) else [])
        return terms

    def _at(self, cumulative: list[tuple[int, int]], q: int) -> int | None:
        """The column of a cumulative variable at position q (None: before its window)."""
        col = None
        for pos, c in cumulative:
            if pos > q:
                break
            col = c
        return col

    # --- recomputation -----------------------------------------------------------------------------

    def _recompute(self) -> None:
        """z (node rebuilt), w (op replayed), the largest transient, and R (replay ms) per point."""
        m, c, p = self.m, self.c, self.p
        self.z: dict[int, np.ndarray] = {}
        groups = p.groups()
        self.replay_terms: dict[int, list[tuple[int, float]]] = {}
        self.transient: dict[int, int] = {}
        for op, rb in p.rebuilds.items():
            z = c.add(len(rb.nodes), ub=1)
            self.z[op] = z
            for i, node in enumerate(rb.nodes):
                if not node.rebuildable:
                    c.ub[z[i]] = 0
                if i < len(rb.targets):
                    c.ge([(z[i], 1), (m.r[node.unit], -1)], 0)
                for child in node.children:
                    unit = rb.nodes[child].unit
                    if unit is None:
                        c.ge([(z[child], 1), (z[i], -1)], 0)
                    else:  # kept: resident; recomputed away: rebuilt too; swapped: back by op (a variant)
                        c.ge([(z[child], 1), (z[i], -1), (m.r[unit], -1)], -1)
                        away = [(m.s[k], 1) for k in groups[unit] if p.units[k].covers(op)]
                        c.le(away + [(z[i], 1)], 1)
            ops = sorted(rb.transient)
            w = dict(zip(ops, c.add(len(ops), ub=1).tolist()))
            for i, node in enumerate(rb.nodes):
                for j in node.ops:
                    c.ge([(w[j], 1), (z[i], -1)], 0)
            self.transient[op] = c.add(1)[0]
            for j in ops:
                c.ge([(self.transient[op], 1), (w[j], -rb.transient[j] / MIB)], 0)
            self.replay_terms[op] = [(w[j], MS * float(p.op_s[j])) for j in ops]

    # --- compute stream ------------------------------------------------------------------------------

    def _compute_stream(self) -> None:
        """Segments run in order; recomputation runs before its op; an op waits for its prefetches."""
        m, c, p = self.m, self.c, self.p
        pos = p.positions
        for i in range(len(pos)):
            replay = self.replay_terms.get(int(pos[i]), [])
            c.ge([(self.o[i], 1), (self.t[i], -1)] + [(col, -v) for col, v in replay], 0)
            if i + 1 < len(pos):
                c.ge([(self.t[i + 1], 1), (self.o[i], -1)], MS * p.seg_s[i])
        last = len(pos) - 1
        c.ge([(self.overhead, 1), (self.o[last], -1)], MS * (p.seg_s[last] - p.baseline_s))
        for k, u in enumerate(p.units):
            i = p.position_of(u.back_before)
            c.ge([(self.o[i], 1), (self.G[k], -1)], 0)
            rb = p.rebuilds.get(u.back_before)
            if rb is not None and u.storage in rb.reads:  # it lands before the recomputations that read it run
                replay = self.replay_terms[u.back_before]
                c.ge([(self.o[i], 1), (self.G[k], -1), (m.s[k], -self.big_m)] + [(col, -v) for col, v in replay],
                     -self.big_m)

    # --- copy lanes ----------------------------------------------------------------------------------

    def _lanes(self) -> None:
        """FIFO device-to-host copies in swap-out order, host-to-device in prefetch order."""
        m, c, p = self.m, self.c, self.p
        rank = {k: i for i, k in enumerate(self.need)}
        previous = None
        for k in sorted(range(len(p.units)), key=lambda k: (not p.units[k].carried, p.units[k].out_after, rank[k])):
            u = p.units[k]
            d2h = MS * u.d2h_s
            i = p.position_of(u.out_after)
            if u.carried:  # copied from the step's start
                c.ge([(self.F[k], 1), (m.s[k], -d2h)], 0)
            else:
                c.ge([(self.F[k], 1), (self.o[i], -1), (m.s[k], -d2h)], MS * p.seg_s[i])
            if previous is not None:
                c.ge([(self.F[k], 1), (self.F[previous], -1), (m.s[k], -d2h)], 0)
            for q, u, late in self.release[k]:  # released at q: its copy was done by then
                c.ge([(self.t[q], 1), (self.F[k], -1), (u, -self.big_m)], -self.big_m)
                if late is not None:
                    c.ge([(self.o[q], 1), (self.F[k], -1), (late, -self.big_m)], -self.big_m)
            previous = k
        if previous is not None and not p.units[previous].carried:  # the step ends after its swap-outs
            c.ge([(self.overhead, 1), (self.F[previous], -1)], -MS * p.baseline_s)
        previous = None
        for k in self.need:
            h2d = MS * p.units[k].h2d_s
            if p.units[k].carried:  # after its swap-out, in the step's time
                c.ge([(self.G[k], 1), (self.F[k], -1), (m.s[k], -self.big_m)], h2d - self.big_m)
            elif p.units[k].wraps:  # after the previous iteration's swap-out: G + baseline + overhead >= F + h2d
                c.ge([(self.G[k], 1), (self.F[k], -1), (self.overhead, 1), (m.s[k], -self.big_m)],
                     h2d - MS * p.baseline_s - self.big_m)
            else:
                c.ge([(self.G[k], 1), (self.F[k], -1), (m.s[k], -self.big_m)], h2d - self.big_m)
            if previous is not None:
                c.ge([(self.G[k], 1), (self.G[previous], -1), (m.s[k], -h2d)], 0)
            before = None
            for q, col in m.triggers[k]:  # issued at the first q with v = 1: copied from t_q on
                terms = [(self.G[k], 1), (self.t[q], -1), (m.s[k], -self.big_m)]
                c.ge(terms + ([(before, self.big_m)] if before is not None else []), h2d - self.big_m)
                before = col
            previous = k
        self._prefetch_order()

    def _prefetch_order(self) -> None:
        """Triggers follow the order of first backward access (the simulator's FIFO order)."""
        m, c = self.m, self.c
        n_pos = len(self.p.positions)
        for a_i, a in enumerate(self.need):
            last_a = m.triggers[a][-1][0]
            for b in self.need[a_i + 1:]:
                if m.triggers[b][0][0] >= last_a:
                    continue
                # T_a <= T_b + n_pos (2 - s_a - s_b), T_k = its last trigger position - the positions from each
                # v column set before it to the next one.
                terms = [(col, w) for col, w in self._steps(m.triggers[a])] + \
                    [(col, -w) for col, w in self._steps(m.triggers[b])]
                terms += [(m.s[a], -n_pos), (m.s[b], -n_pos)]
                c.ge(terms, last_a - m.triggers[b][-1][0] - 2 * n_pos)

    @staticmethod
    def _steps(cumulative: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """(v column, positions to the next trigger position) of every trigger position but the last."""
        return [(col, q_next - q) for (q, col), (q_next, _) in itertools.pairwise(cumulative)]

    def _lane_cuts(self) -> None:
        """Valid inequalities without big-M, so that the LP relaxation pays for copies.

        Swap-outs released by position q were all copied one after another, after the op of
        the earliest of them ended: t_q >= end(out_j) + sum of d2h over those with out >= out_j.
        Prefetches due by q and issued at or after position a were all copied one after another
        from t_a on: o_q >= t_a + sum of h2d over them.

        The sums over "those with out >= out_j" are suffix sums, one per j: each is a column
        y_j = y_next + (d2h of j if released by q), so the cuts at q hold O(n) coefficients,
        not O(n^2) (each y equals its sum: the same LP, with fewer nonzeros).
        """
        p, c, m = self.p, self.c, self.m
        by_out = sorted(range(len(p.units)), key=lambda k: p.units[k].out_after)
        for q in np.flatnonzero(np.maximum(p.seg_load, p.pre_load) > self.budget):
            op = int(p.positions[q])
            inside = [k for k in by_out if p.units[k].out_after < op <= p.units[k].back_before]
            suffix = c.add(len(inside))  # suffix[a]: d2h seconds (ms) of inside[a:] released by q
            for a, k in enumerate(inside):
                terms = [(suffix[a], 1)] + ([(suffix[a + 1], -1)] if a + 1 < len(inside) else [])
                c.eq(terms + [(col, -MS * p.units[k].d2h_s * coef) for col, coef in self._released(k, q, late=False)],
                     0)
                i = p.position_of(p.units[k].out_after)
                c.ge([(self.t[q], 1), (self.o[i], -1), (suffix[a], -1)], MS * p.seg_s[i])
        for k_last in {p.units[k].back_before for k in range(len(p.units))}:
            q = p.position_of(k_last)
            for a in range(max(0, q - self.windows.reach()), q + 1):
                op_a = int(p.positions[a])
                due = [k for k, u in enumerate(p.units) if op_a <= u.back_before <= k_last]
                terms = [(self.o[q], 1), (self.t[a], -1)]
                for k in due:
                    h2d = MS * p.units[k].h2d_s
                    terms.append((m.s[k], -h2d))
                    issued = self._at(m.triggers[k], a - 1)
                    if issued is not None:
                        terms.append((issued, h2d))
                if due:
                    c.ge(terms, 0)

    # --- memory --------------------------------------------------------------------------------------

    def _memory(self) -> None:
        """The load at every segment and in every pre-phase (prefetches issued, recomputations
        running) stays within the budget."""
        p = self.p
        for i in range(len(p.positions)):
            self._cap(self._away_terms(i, pre=False), p.seg_load[i])
        for i in sorted(self.two_phase):
            terms = self._away_terms(i, pre=True)
            rb = p.rebuilds.get(int(p.positions[i]))
            if rb is not None:
                terms += [(col, node.nbytes / MIB) for col, node in zip(self.z[rb.op], rb.nodes)]
                terms.append((self.transient[rb.op], 1.0))
            self._cap(terms, p.pre_load[i])

    def _away_terms(self, i: int, pre: bool) -> list[tuple[int, float]]:
        """Load change at position i: swapped maps released and not yet prefetched, recomputed maps
        dropped (before their own recomputation, in the pre-phase of their back op)."""
        m, p = self.m, self.p
        op = int(p.positions[i])
        terms = []
        for k, u in enumerate(p.units):
            size = u.nbytes / MIB
            if u.wraps:
                terms += self._wrap_terms(k, i, op, size, pre)
                continue
            if u.out_after < op < u.back_before or (pre and op == u.back_before):
                terms.append((m.r[k], -size))
            if u.out_after < op <= u.back_before:
                terms += [(col, -size * coef) for col, coef in self._released(k, i, late=not pre)]
                issued = self._at(m.triggers[k], i)
                if issued is not None:
                    terms.append((issued, size))
        return terms

    def _wrap_terms(self, k: int, i: int, op: int, size: float, pre: bool) -> list[tuple[int, float]]:
        """A wrap-around unit: released in the tail; on the host from the iteration's start (a carried
        one: from its release in the head) until its prefetch is issued in the head."""
        u, terms = self.p.units[k], []
        if op > u.out_after:
            terms += [(col, -size * coef) for col, coef in self._released(k, i, late=not pre)]
        if op <= u.back_before:
            away = self._released(k, i, late=not pre) if u.carried else [(self.m.s[k], 1.0)]
            terms += [(col, -size * coef) for col, coef in away]
            issued = self._at(self.m.triggers[k], i)
            if issued is not None:
                terms.append((issued, size))
        return terms

    def _cap(self, terms: list[tuple[int, float]], base_bytes: float) -> None:
        self.c.le(terms, (self.budget - base_bytes) / MIB)
