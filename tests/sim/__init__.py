"""Tests of memplan.sim."""
