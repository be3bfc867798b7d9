"""What every benchmark does with its figures: a JSON file under benchmarks/results/ and a line in
benchmarks/README.md (the table of results with date, device and command)."""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def save_result(name: str, result: dict) -> Path:
    """Write ``result`` to benchmarks/results/<name>.json and return the path."""
    path = HERE / "results" / f"{name}.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def record_line(line: str, append: bool = True) -> None:
    """Print the README table line and, unless told not to, append it to benchmarks/README.md."""
    print(line)
    if append:
        with open(HERE / "README.md", "a", encoding="utf-8") as f:
            f.write(line + "\n")
