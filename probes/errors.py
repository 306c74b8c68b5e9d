"""Error classes shared by every part of headscope.

The command line turns any :class:`HeadscopeError` (and ``ValueError``/``TypeError``
raised for user input) into one line on stderr and exit code 2.
"""

from __future__ import annotations


class HeadscopeError(Exception):
    """Base class for errors headscope reports to the user in one line."""


class ModelIncompatibleError(HeadscopeError):
    """The model cannot be handled by the requested backend (e.g. an architecture
    the in-house stack does not cover); the message names the way out."""


class UnknownGGUFArchitectureError(ModelIncompatibleError):
    """A GGUF file's ``general.architecture`` is not one headscope's metadata reader knows
    (transformers' own reader may still know it)."""


class CheckpointError(HeadscopeError):
    """A checkpoint is missing, truncated, corrupt, or does not match its config."""


class InputFileError(HeadscopeError, ValueError):
    """A malformed input file. ``str(err)`` reads ``file:line:column: message``.

    >>> str(InputFileError("corpus.conllu", 3, 7, "expected 10 tab-separated columns, got 9"))
    'corpus.conllu:3:7: expected 10 tab-separated columns, got 9'
    """

    def __init__(self, path, line: int | None, column: int | None, message: str):
        self.path = str(path)
        self.line = line
        self.column = column
        self.message = message
        where = self.path
        if line is not None:
            where += f":{line}"
            if column is not None:
                where += f":{column}"
        super().__init__(f"{where}: {message}")


class NumericalError(HeadscopeError):
    """NaN or inf found in a capture; the message names the layer and head."""


class MemoryBudgetError(HeadscopeError):
    """A capture would exceed the configured memory budget."""
