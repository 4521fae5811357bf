"""Tests of memplan.tracing."""
