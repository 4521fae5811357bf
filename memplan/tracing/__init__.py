"""Recording one training iteration as a `memplan.model.Trace`: the tracer, trace files and
other tools' formats (importers), iteration detection, and op times (measured or benched)."""
