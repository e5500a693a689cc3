"""Evidence on disk: written as it is collected, atomically, secrets redacted.

Paths returned are relative to the run directory, as report.json's `evidence` lists them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .redact import redact_obj, redact_text


class EvidenceStore:
    def __init__(self, run_dir: Path, subdir: str = "", secrets: list[str] | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.base = self.run_dir / subdir if subdir else self.run_dir
        self.base.mkdir(parents=True, exist_ok=True)
        self.secrets = [s for s in (secrets or []) if s]

    def path(self, name: str) -> Path:
        return self.base / name

    def rel(self, path: Path) -> str:
        return os.path.relpath(path, self.run_dir)

    def write_text(self, name: str, text: str) -> str:
        target = self.path(name)
        atomic_write(target, redact_text(text, self.secrets))
        return self.rel(target)

    def write_json(self, name: str, data: Any) -> str:
        target = self.path(name)
        atomic_write(target, json.dumps(redact_obj(data, self.secrets), indent=2, default=str) + "\n")
        return self.rel(target)

    def append_jsonl(self, name: str, record: dict[str, Any]) -> str:
        """Append one record and flush: what was measured before a crash stays on disk."""
        target = self.path(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(redact_obj(record, self.secrets), default=str)
        with target.open("a") as handle:
            handle.write(line + "\n")
            handle.flush()
        return self.rel(target)


def atomic_write(target: Path, text: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(target)
