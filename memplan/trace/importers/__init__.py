"""memplan.trace.importers."""
