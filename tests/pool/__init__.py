"""Tests of memplan.pool."""
