"""Exercises: write the library's pieces yourself; the project's own guarantees check them.

    python -m nanodflash.exercises                           # the list: what you write, where it is taught
    python -m nanodflash.exercises start rejection_verify    # writes rejection_verify.py, a skeleton to edit
    python -m nanodflash.exercises check rejection_verify rejection_verify.py
    python -m nanodflash.exercises hint rejection_verify 1   # 1 the idea, 2 the steps, 3 the code

`check` puts your function in place of the library's (everywhere the library calls it), runs the claims the
piece must meet on tiny seeded models, and prints each with PASS or FAIL and, on a failure, what went wrong.
Exit status 0 when every claim holds. The references never run your code: they are computed with the
library's originals. Nothing in nanodflash's algorithm imports this package.
"""

from .catalog import BY_NAME, EXERCISES, skeleton
from .check import run_checks
from .swap import StudentFileError, load_function

__all__ = ["BY_NAME", "EXERCISES", "StudentFileError", "load_function", "run_checks", "skeleton"]
