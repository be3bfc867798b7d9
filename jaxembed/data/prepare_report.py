"""What ``jaxembed data prepare`` read, wrote and skipped (``PrepareReport``): the counts per dataset, its notes, and
report.json / report.txt in the store's folder (``jaxembed.data.store`` writes them; the counts themselves are
``jaxembed.data.tally``'s)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from jaxembed.data.tally import Tally


@dataclass
class PrepareReport:
    """What ``write_store`` read, wrote and skipped, per dataset (``Tally``: read, written, invalid, filtered,
    skipped records), plus per-dataset notes (e.g. examples with fewer negatives than num_negatives)."""

    out_dir: str
    on_error: str
    datasets: list[Tally] = field(default_factory=list)
    notes: dict[str, list[str]] = field(default_factory=dict)

    @property
    def read(self) -> int:
        return sum(t.read for t in self.datasets)

    @property
    def written(self) -> int:
        return sum(t.written for t in self.datasets)

    @property
    def invalid(self) -> int:
        return sum(t.invalid for t in self.datasets)

    @property
    def filtered(self) -> int:
        return sum(t.filtered for t in self.datasets)

    def tally(self, name: str) -> Tally:
        for t in self.datasets:
            if t.name == name:
                return t
        raise KeyError(name)

    def to_dict(self) -> dict:
        return dict(self.to_dict_head(),
                    datasets=[dict(t.to_dict(), notes=self.notes.get(t.name, [])) for t in self.datasets])

    def summary(self) -> str:
        """A table of counts per dataset with the skip reasons (no per-record lines)."""
        w = max([len(t.name) for t in self.datasets] + [7])
        lines = [f"{'dataset':<{w}}  {'read':>8}  {'written':>8}  {'invalid':>8}  {'filtered':>8}  reasons"]
        for t in self.datasets:
            reasons = "; ".join(f"{r}: {n}" for r, n in t.reasons().items())
            lines.append(f"{t.name:<{w}}  {t.read:>8}  {t.written:>8}  {t.invalid:>8}  {t.filtered:>8}  {reasons}")
        lines.append(f"{'total':<{w}}  {self.read:>8}  {self.written:>8}  {self.invalid:>8}  {self.filtered:>8}")
        for name, notes in self.notes.items():
            for n in notes:
                lines.append(f"note: {name}: {n}")
        return "\n".join(lines)

    def _text_lines(self):
        head = (f"jaxembed data prepare -> {self.out_dir} (on_error={self.on_error}): {self.read} records read, "
                f"{self.written} written, {self.invalid} invalid and skipped, {self.filtered} left out by a rule")
        yield from [head, "", self.summary()]
        for t in self.datasets:
            if t.n_skipped:
                yield from ["", f"skipped records of {t.name} ({t.n_skipped}):"]
                for s in t.iter_skipped():
                    yield f"  {s}"

    def to_text(self) -> str:
        """The summary, then every skipped record, one per line."""
        return "\n".join(self._text_lines()) + "\n"

    def write(self, folder: Path) -> None:
        """report.json and report.txt in ``folder``, streamed: the skipped records are never all in memory."""
        with open(folder / "report.txt", "w", encoding="utf-8") as f:
            for line in self._text_lines():
                f.write(line + "\n")
        with open(folder / "report.json", "w", encoding="utf-8") as f:
            f.write(json.dumps(self.to_dict_head(), ensure_ascii=False)[:-1] + ', "datasets": [')
            for i, t in enumerate(self.datasets):
                d = dict(t.summary_dict(), notes=self.notes.get(t.name, []))
                f.write(("," if i else "") + "\n " + json.dumps(d, ensure_ascii=False)[:-1] + ', "skipped": [')
                for j, s in enumerate(t.iter_skipped()):
                    f.write(("," if j else "") + "\n  " + json.dumps(s.to_dict(), ensure_ascii=False))
                f.write("]}")
            f.write("\n]}\n")

    def to_dict_head(self) -> dict:
        return {"out_dir": self.out_dir, "on_error": self.on_error, "read": self.read, "written": self.written,
                "invalid": self.invalid, "filtered": self.filtered}
