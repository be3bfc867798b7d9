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


def line_in(exc: BaseException, path) -> int | None:
    """The line of ``path`` (a Python file, e.g. a config file) where ``exc`` was raised or passed through last,
    from its traceback; None when the file is not in it."""
    import traceback
    from pathlib import Path

    try:
        target = Path(path).resolve()
    except OSError:
        return None
    line = None
    for fs in traceback.extract_tb(exc.__traceback__):
        try:
            if Path(fs.filename).resolve() == target:
                line = fs.lineno
        except OSError:
            continue
    return line


def in_file(exc: BaseException, path) -> str:
    """``path:line`` of ``exc`` in ``path`` (see ``line_in``), or ``path``."""
    line = line_in(exc, path)
    return f"{path}:{line}" if line is not None else str(path)


def with_file(exc: BaseException, path, prefix: str = "") -> str:
    """The message of ``exc`` led by ``prefix`` + ``path:line`` (see ``in_file``), unless it already names the file
    before its first ': '."""
    from pathlib import Path

    msg = str(exc)
    if Path(str(path)).name in msg.split(": ", 1)[0]:
        return msg
    return f"{prefix}{in_file(exc, path)}: {msg}"
