"""Checks of the repository as a whole: the documentation and README examples, the code's
structure, self-containment, the command line's start-up, fuzzing of user input."""
