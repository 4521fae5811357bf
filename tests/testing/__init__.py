"""Tests of memplan.testing."""
