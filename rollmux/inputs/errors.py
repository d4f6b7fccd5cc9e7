"""The one error type of bad input: it names the file, the line and the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rollmux.core.errors import RollMuxError


class InputError(RollMuxError):
    """Bad user input, located as precisely as the format allows."""

    def __init__(self, path: Path | str, reason: str, line: int | None = None, field: str | None = None):
        self.path = str(path)
        self.line = line
        self.field = field
        self.reason = reason
        where = self.path if line is None else f"{self.path}:{line}"
        what = f"field '{field}': " if field else ""
        super().__init__(f"{where}: {what}{reason}")


class MissingField(ValueError):
    """A field that a job of its kind needs: a model validator raises it, and the error
    names that field (pydantic would name the whole job)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def problem(error: dict[str, Any]) -> tuple[tuple[Any, ...], str]:
    """Where one of pydantic's errors is and what it says, in a user's words: a
    validator's own message without pydantic's "Value error, " before it, at the field a
    :class:`MissingField` names."""
    loc, msg = tuple(error["loc"]), error["msg"]
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, ValueError):
        msg = str(cause)
    if isinstance(cause, MissingField):
        loc = (*loc, cause.field)
    return loc, msg


def from_validation(path: Path | str, error: ValidationError, line: int | None = None, prefix: str = "") -> InputError:
    """The first problem pydantic found, as an InputError naming its field."""
    loc, msg = problem(error.errors()[0])
    field = ".".join(str(p) for p in loc) or None
    if prefix:
        field = f"{prefix}.{field}" if field else prefix
    return InputError(path, msg, line=line, field=field)


def read_json(path: Path | str) -> Any:
    """A JSON file's content; a missing or malformed file is an InputError with its line."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(path, "file not found") from None
    except json.JSONDecodeError as error:
        raise InputError(path, f"not valid JSON: {error.msg}", line=error.lineno) from None
    except RecursionError:
        raise InputError(path, "nested too deeply to be a RollMux file") from None
