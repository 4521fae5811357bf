"""memplan.exec."""
