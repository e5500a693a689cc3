"""The captured state of a node (roles/node_state): its one-call script's records, the bundles saved as
state.json, and their summary (driver versions by source, packages, what nvidia-smi answered)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ...core.evidence import atomic_write
from ...core.profile import ConfigError
from ...core.redact import redact_text
from ...parsers.driver import branch_of, parse_fabricmanager_version, parse_proc_version
from ...parsers.lsmod import parse_lsmod
from ...parsers.nvidia_smi import parse_query_csv
from ...preflight.stage import split_stream

# The captured state must hold at least these (docs/sources.md#a001: hostname, uname -a, nvidia-smi, the
# driver version) for an upgrade to start from a known state.
CAPTURE_REQUIRED = ("hostname", "uname_a", "nvidia_smi", "nvidia_smi_query")
# A rollback starts from a node that may be broken: the package database and some driver evidence
# (the loaded module's version file, or nvidia-smi's answer whatever its exit status) are enough;
# a failing nvidia-smi is the evidence of the broken state, kept with its output and exit status.
ROLLBACK_CAPTURE_REQUIRED = ("hostname", "packages")


# --- the captured state (roles/node_state) -----------------------------------------------------

def capture_records(stream: str, marker: str, commands: list[Mapping[str, Any]],
                    secrets: list[str] | None = None) -> list[dict[str, Any]]:
    """roles/node_state's records from its one-call script (the framing of roles/preflight's
    node_script.sh.j2, cut by preflight.stage.split_stream): one record per command, in order, with
    raw stdout and stderr (secrets redacted), the exit status and whether the tool was absent. A
    command the answer never reached (connection lost) gets rc None and says so."""
    records, _finished = split_stream(stream, marker)
    by_name = {r.name: r for r in records}
    out = []
    for command in commands:
        name = str(command.get("name"))
        record = by_name.get(name)
        out.append({
            # the command too: a site's own check may carry a credential in its arguments (node_state_extra_commands)
            "name": name, "cmd": [redact_text(str(a), secrets) for a in command.get("argv") or []],
            "image": command.get("image"),
            "rc": record.rc if record else None,
            "stdout": redact_text(record.stdout, secrets) if record else "",
            "stderr": redact_text(record.stderr, secrets) if record else "the node's answer never reached this command",
            "missing": bool(record and record.missing), "timed_out": bool(record and record.timed_out),
            "skipped": False})
    return out


def save_captures(bundles: Iterable[Mapping[str, Any]]) -> list[str]:
    """Write each node's capture bundle (roles/node_state: host, dest, runtime, records) to
    <dest>/state.json, atomically; `dest` itself is not part of the file."""
    paths = []
    for bundle in bundles:
        if not bundle.get("dest") or not bundle.get("host"):
            raise ConfigError(f"a capture bundle needs host and dest (got keys {sorted(bundle)}): roles/node_state "
                              "sets both")
        path = Path(str(bundle["dest"])) / "state.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {k: v for k, v in bundle.items() if k != "dest"}
        atomic_write(path, json.dumps(data, indent=2, default=str) + "\n")
        paths.append(str(path))
    return paths


def load_capture(state_dir: Path) -> dict[str, Any]:
    """Summarise roles/node_state's bundle: the driver and Fabric Manager versions a rollback
    returns to, modules, containers, the installed packages, the boot id, and what nvidia-smi
    answered (exit status and output, also when it fails). `missing` names required records of an
    upgrade's capture that did not succeed; `missing_for_rollback` those a rollback needs (a broken
    node's capture is usable). `sources` is the driver version each source reports; `mixed` says
    they disagree (new user space over an old kernel module, Fabric Manager apart from the driver)."""
    bundle_path = Path(state_dir) / "state.json"
    if not bundle_path.is_file():
        return {"missing": list(CAPTURE_REQUIRED), "missing_for_rollback": list(ROLLBACK_CAPTURE_REQUIRED),
                "path": str(bundle_path), "driver_version": None, "sources": {}, "mixed": False,
                "packages": [], "gpu_tool": None}
    bundle = json.loads(bundle_path.read_text())
    records = {r["name"]: r for r in bundle.get("records", [])}

    def ok(name: str) -> str | None:
        record = records.get(name)
        return str(record.get("stdout") or "") if record and record.get("rc") == 0 else None

    query = ok("nvidia_smi_query")
    gpus = parse_query_csv(query) if query is not None else None
    proc = ok("driver_version")
    proc_version = parse_proc_version(proc).version if proc else None
    fm = ok("fabricmanager_version")
    fm_version = parse_fabricmanager_version(fm).version if fm else None
    lsmod_text = ok("lsmod")
    packages = (ok("packages") or "").strip().splitlines()
    smi_version = gpus.driver_version if gpus is not None else None
    driver_version = proc_version or smi_version
    gpu_tool = _gpu_tool(records.get("nvidia_smi"))
    sources = {k: v for k, v in {"kernel_module": proc_version, "nvidia_smi": smi_version,
                                 "packages": package_driver_version(packages),
                                 "fabricmanager": fm_version}.items() if v}
    mixed = len(set(sources.values())) > 1 or bool(gpu_tool and gpu_tool["version_mismatch"])
    return {
        "host": bundle.get("host"),
        "path": str(bundle_path),
        "hostname": (ok("hostname") or "").strip() or None,
        "boot_id": (ok("boot_id") or "").strip() or None,
        "driver_version": driver_version,
        "driver_branch": branch_of(driver_version) if driver_version else None,
        "gpu_count": gpus.count if gpus is not None else None,
        "fabricmanager_version": fm_version,
        "modules": parse_lsmod(lsmod_text).nvidia_modules() if lsmod_text else [],
        "containers": [line for line in (ok("containers") or "").splitlines() if line.strip()],
        "packages": packages,
        "gpu_tool": gpu_tool,
        "sources": sources,
        "mixed": mixed,
        "missing": [name for name in CAPTURE_REQUIRED if ok(name) is None]
                   + ([] if driver_version else ["driver version (nvidia-smi query or driver version file)"]),
        "missing_for_rollback": [name for name in ROLLBACK_CAPTURE_REQUIRED if not (ok(name) or "").strip()]
                                + ([] if proc_version or gpu_tool else
                                   ["driver evidence (driver version file or nvidia-smi's answer)"]),
    }


def _gpu_tool(record: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """nvidia-smi as it answered: exit status and exact output, failing or not (None: not run)."""
    if not record or record.get("missing") or record.get("rc") is None:
        return None
    output = "\n".join(x for x in (str(record.get("stdout") or ""), str(record.get("stderr") or "")) if x.strip())
    return {"rc": record.get("rc"), "output": output[:4000], "ok": record.get("rc") == 0,
            "version_mismatch": "Driver/library version mismatch" in output,
            "no_devices": "No devices were found" in output}


_VERSION = re.compile(r"(\d{3,}\.\d+(?:\.\d+)?)")


def package_driver_version(packages: Iterable[str]) -> str | None:
    """The driver version of the installed driver package (dpkg `NAME VERSION` or rpm NEVRA lines)."""
    for line in packages:
        parts = line.split()
        if not parts or not re.match(r"^(nvidia-driver|nvidia-open|cuda-drivers)", parts[0]):
            continue
        match = _VERSION.search(parts[1] if len(parts) > 1 else parts[0])
        if match:
            return match.group(1)
    return None
