"""Tests of memplan.model."""
