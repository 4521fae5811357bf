"""Tests of memplan.reports."""
