"""The profile a run is judged on: the one it ran with (issue 28, item 2).

`open_run` freezes the profile into ``evidence/profile.yml`` (core/rundir.py); every stage judged with that
copy, so the report does too. ``vllm-acceptance report --profile P`` is accepted only when P is that profile
(same name, same content); any other profile is refused (exit 2), since a CPU lab run re-judged on the
flagship profile would read as a signable release of a contract it never ran. A run recorded before the
frozen copy existed names its profile in run.json; ``--profile`` must then carry that name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..core.profile import ConfigError, Profile, load_profile
from ..core.redact import redact_obj
from ..core.rundir import PROFILE_EVIDENCE, RunDir


def _run_profile_name(run_dir: Path) -> str | None:
    path = RunDir(run_dir).run_json
    try:
        data: Any = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    name = data.get("profile") if isinstance(data, dict) else None
    return str(name) if name else None


def same_profile(a: Profile, b: Profile) -> bool:
    """Same name and the same content (secrets redacted on both sides, as the frozen copy is)."""
    return a.name == b.name and redact_obj(a.data) == redact_obj(b.data)


def run_profile(run_dir: Path, requested: str | Path | None) -> Profile:
    """The frozen profile of the run; ConfigError (exit 2) when `requested` is another profile."""
    run_dir = Path(run_dir)
    frozen_path = RunDir(run_dir).profile_path
    if frozen_path.is_file():
        frozen = load_profile(frozen_path)
        if requested is None:
            return frozen
        given = load_profile(requested)
        if not same_profile(given, frozen):
            what = (f"profile {given.name!r}" if given.name != frozen.name
                    else f"a different version of profile {given.name!r}")
            raise ConfigError(
                f"--profile {requested}: {what} is not the profile run {run_dir.name} ran with ({frozen.name!r}, "
                f"frozen in {frozen_path}); a run is judged only on the profile it ran with: drop "
                "--profile (the frozen copy is used), or run the acceptance again with acceptance_profile set to "
                f"{given.name}")
        return frozen
    recorded = _run_profile_name(run_dir)
    if requested is None:
        raise ConfigError(f"--profile: run {run_dir} has no {PROFILE_EVIDENCE} (opened before profiles were frozen): "
                          f"give the profile it ran with{f' ({recorded})' if recorded else ''}, e.g. "
                          f"--profile profiles/{recorded or '<name>'}.yml")
    given = load_profile(requested)
    if recorded and given.name != recorded:
        raise ConfigError(f"--profile {requested}: profile {given.name!r} is not the profile run {run_dir.name} "
                          f"ran with ({recorded!r}, run.json); a run is judged only on the profile it ran with: give "
                          f"--profile profiles/{recorded}.yml")
    return given
