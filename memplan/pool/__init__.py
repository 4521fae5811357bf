"""memplan.pool."""
