"""Traces of one training iteration: data model, tracer, file formats, importers."""
