"""Tests of memplan.cost."""
