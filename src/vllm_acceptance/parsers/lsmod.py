"""`lsmod`: which kernel modules are loaded (nvidia, nvidia_peermem / nv_peer_mem, ...)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .base import Parsed


@dataclass
class Module:
    name: str
    size: int | None
    used: int | None
    used_by: list[str]


@dataclass
class Lsmod(Parsed):
    modules: dict[str, Module] = field(default_factory=dict)

    def loaded(self, name: str) -> bool:
        return name in self.modules

    def nvidia_modules(self) -> list[str]:
        return sorted(m for m in self.modules if m.startswith(("nvidia", "nv_")) or m == "gdrdrv")


def parse_lsmod(text: str) -> Lsmod:
    result = Lsmod()
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        result.errors.append("empty lsmod output")
        return result
    for line in lines:
        parts = line.split()
        if parts[0] == "Module":  # header: Module  Size  Used by
            continue
        if len(parts) < 3 or not parts[1].isdigit():
            result.errors.append(f"unreadable lsmod line: {line[:80]!r}")
            continue
        used_by = parts[3].strip(",").split(",") if len(parts) > 3 and parts[3] != "-" else []
        result.modules[parts[0]] = Module(
            name=parts[0], size=int(parts[1]),
            used=int(parts[2]) if parts[2].lstrip("-").isdigit() else None,
            used_by=[u for u in used_by if u])
    if not result.modules and not result.errors:
        result.errors.append("lsmod listed no modules")
    return result
