"""Tests of memplan.zoo."""
