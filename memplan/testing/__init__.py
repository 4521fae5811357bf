"""memplan.testing."""
