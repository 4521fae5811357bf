"""The discrete-event simulator and the independent plan validator."""
