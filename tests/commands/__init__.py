"""Tests of memplan.commands."""
