"""Tests of memplan.planners."""
