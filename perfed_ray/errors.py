"""Errors that mean "the user's input is wrong": the CLI prints them and exits 2; and
the warning about results files that analysis skips.

Kept free of heavy imports so that a bad configuration is reported at once,
before torch, Ray or the data are loaded.
"""

import difflib
from collections.abc import Iterable


class InputError(ValueError):
    """Bad input; the message names the problem and the fix."""


class ConfigError(InputError):
    """A configuration key, value or file is wrong."""


class DataError(InputError):
    """The data set cannot be had, or cannot be split as configured."""


class UnreadableFile(UserWarning):
    """A file in a results folder that analysis skipped: not a results file, or one that
    cannot be read. The CLI prints each as one line."""


def first_line(err: BaseException) -> str:
    """An error as one line, its type first: what a message or a table cell shows of it."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"


def did_you_mean(name: object, known: Iterable[str]) -> str:
    """`` (did you mean 'alpha'?)`` for the known name closest to a misspelt one, or
    nothing: the one hint every unknown key, section or component name gets."""
    close = difflib.get_close_matches(str(name), list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
