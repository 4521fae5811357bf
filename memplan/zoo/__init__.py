"""memplan.zoo."""
