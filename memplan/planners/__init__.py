"""Planners: one module or package per planner family, the registry and `memplan.plan` (`base`),
and the rules several families share (`kit`). The plan they return is `memplan.model`'s."""
