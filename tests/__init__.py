"""The test suite, laid out as memplan/ is: tests/<package>/test_<module>.py tests
memplan/<package>/<module>.py (a subpackage's module <sub>/<module>.py: test_<sub>_<module>.py),
tests/test_<module>.py a top-level module, and tests/project/ the repository as a whole.

Every folder is a package, so that files of the same name in two folders do not clash; a test
module imports another's helpers as `tests.<folder>.<module>`.
"""
