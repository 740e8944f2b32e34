"""Small JSON caches under the evaluation cache directory: one file per key, written atomically, so an
interrupted run resumes from what it finished and a reader never sees half a file."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any


def slug(text: str) -> str:
    """A file-name-safe form of a device name, a version or a task id."""
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-") or "x"


def load_json(path: Path) -> Any | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def save_json(path: Path, data: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(path)


def _probe_path(cache_dir: Path, task: Any, track: str) -> Path:
    return Path(cache_dir) / "probe" / f"{slug(task.task_id)}-{task.source_sha256[:16]}-{track}.json"


def load_probe(cache_dir: Path, task: Any, track: str) -> tuple[str, ...] | None:
    """The trivial-solution probe's result for a task (done once per task source and track)."""
    data = load_json(_probe_path(cache_dir, task, track))
    return tuple(data["degenerate"]) if isinstance(data, dict) and "degenerate" in data else None


def save_probe(cache_dir: Path, task: Any, track: str, degenerate: tuple[str, ...]) -> None:
    save_json(_probe_path(cache_dir, task, track), {"task_id": task.task_id, "degenerate": list(degenerate)})
