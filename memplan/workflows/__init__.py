"""Compositions on top of every other layer: optimize a training step, run and measure a
workload, find the largest batch, sweep planners over budgets, trace zoo workloads."""
