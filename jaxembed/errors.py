"""User-facing errors: each names the file, line and field at fault and how to fix it."""

from __future__ import annotations


class UserError(ValueError):
    """An error in the user's input or configuration; the CLI prints it without a traceback (exit status 2)."""


class InputError(UserError):
    """A bad record in an input file."""

    def __init__(self, path, line: int | None, message: str, fix: str | None = None, field: str | None = None):
        self.path, self.line, self.field, self.fix = str(path), line, field, fix
        where = self.path + (f":{line}" if line is not None else "")
        what = f"field '{field}': {message}" if field else message
        super().__init__(f"{where}: {what}" + (f" (fix: {fix})" if fix else ""))
