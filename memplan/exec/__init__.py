"""memplan.exec: run a Plan in real PyTorch training (see api.optimize)."""


def measure_overhead(trace, plan, budget=None, **kwargs) -> float:
    """Measured overhead of `plan` (see measure.measure_overhead); imported lazily."""
    from .measure import measure_overhead as measure

    return measure(trace, plan, budget, **kwargs)
