"""The project's own error types.

Every problem with user input (data files, configs, checkpoints) is raised as a
:class:`StructNMTError` subclass whose message names the file and line, or the config
field, so that the command line can print one clear line instead of a traceback.
"""

from __future__ import annotations

from pathlib import Path


class StructNMTError(Exception):
    """Base class: the command line prints these as ``error: <message>`` and exits 2."""


class DataError(StructNMTError):
    """Bad input data; says where (file and 1-based line) when it is known."""

    def __init__(self, message: str, path: str | Path | None = None, line: int | None = None):
        self.path = str(path) if path is not None else None
        self.line = line
        where = ""
        if self.path is not None:
            where = self.path + (f":{line}" if line is not None else "") + ": "
        super().__init__(where + message)


class ConfigError(StructNMTError):
    """A config field is unknown, ill-typed or impossible; the message names the field path."""

    def __init__(self, message: str, field: str | None = None, path: str | Path | None = None):
        self.message = message
        self.field = field
        prefix = f"{path}: " if path else ""
        prefix += f"{field}: " if field else ""
        super().__init__(prefix + message)


class CheckpointError(StructNMTError):
    """A checkpoint is corrupt, truncated or belongs to a different model."""


class ParserError(StructNMTError):
    """A parser back end is missing or produced output that cannot be aligned."""
