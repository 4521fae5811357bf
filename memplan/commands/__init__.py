"""memplan.commands."""
