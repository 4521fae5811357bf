"""Tests of memplan.exec."""
