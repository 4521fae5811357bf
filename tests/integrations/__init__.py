"""Tests of memplan.integrations."""
