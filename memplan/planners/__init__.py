"""Plans and planners: the plan format, the registry and one module per planner family."""
