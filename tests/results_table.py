"""A results file written by GPU tests: NAME.json (rows and the machine manifest) and NAME.md (a table),
both written again after every row, so a run cut off by its time limit keeps the rows it has.

The folder is the `results_dir` fixture's (tests/conftest.py: --results-dir, or CUTEGEN_TEST_RESULTS;
bench/h200_all.sh points it at the call's output, whose tables are kept in bench/results/).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Sequence

from cutegen.cli import env
from cutegen.manifest import machine_manifest


def cell(value: Any) -> str:
    """A table cell: floats to 4 significant digits, None as '-', no '|' or newline inside."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "/").replace("\n", " ")[:200]


class ResultsTable:
    """Rows of one results file; `columns` are the row keys shown in the Markdown table (the JSON keeps
    every key). Thread-safe: tests that evaluate side by side add rows from several threads."""

    def __init__(self, folder: Path, name: str, title: str, columns: Sequence[str], note: str = "") -> None:
        self.folder, self.name, self.title, self.columns, self.note = Path(folder), name, title, list(columns), note
        self.rows: list[dict[str, Any]] = []
        self.extra: dict[str, Any] = {}
        self.manifest = machine_manifest(env.runtime_config())
        self._lock = threading.Lock()

    def add(self, row: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.rows.append(row)
            self.write()
        return row

    def set(self, key: str, value: Any) -> None:
        """A value beside the rows (a measurement of the whole run), kept in the JSON and shown below the table."""
        with self._lock:
            self.extra[key] = value
            self.write()

    def write(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        data = {"manifest": self.manifest, **self.extra, "rows": self.rows}
        (self.folder / f"{self.name}.json").write_text(json.dumps(data, indent=1, default=str))
        m = self.manifest
        lines = [f"# {self.title}", "",
                 f"{m.get('gpu_name') or 'no GPU'}, driver {m.get('driver_version')}, CUDA {m.get('cuda_runtime')},"
                 f" torch {m.get('torch_version')}, nvcc {m.get('nvcc_version')}, CUTLASS {m.get('cutlass_version')},"
                 f" {m.get('cpu_count')} CPUs, {m.get('timestamp_utc')}.", ""]
        lines += [self.note, ""] if self.note else []
        lines += ["| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(cell(row.get(c)) for c in self.columns) + " |" for row in self.rows]
        for key, value in self.extra.items():
            lines += ["", f"{key}:", "", "```", json.dumps(value, indent=1, default=str)[:4000], "```"]
        (self.folder / f"{self.name}.md").write_text("\n".join(lines) + "\n")
