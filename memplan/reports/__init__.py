"""The command line's reports: `memplan compare` (measured and simulated points, their pages), `memplan report`
(one plan as a self-contained HTML page) and `memplan sweep` (planners over budgets, a Pareto plot).

They stand on the library (memplan.workflows and below); nothing in the library imports them.
"""
