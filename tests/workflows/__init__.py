"""Tests of memplan.workflows."""
