"""Placeholder: filled in by its issue."""


def add_parser(sub):
    """Nothing registered yet."""
