"""The corpus of real artefacts (tests/fixtures/real/): read each file with the project's parser or
rule and compare with the expectations a human expert wrote beside it (`<name>.yml`, key `expect`).

Used by tests/unit/test_real_corpus.py (every expectation must hold) and benchmarks/real_corpus.py
(how many files of each kind read as expected). Only the keys an expectation names are compared.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.parsers import nvidia_smi
from vllm_acceptance.parsers.driver import parse_proc_version
from vllm_acceptance.parsers.nccl_tests import parse_all_reduce_perf
from vllm_acceptance.parsers.nvidia_smi import parse_query_csv, parse_table, parse_xml
from vllm_acceptance.parsers.rdma import parse_ibv_devinfo
from vllm_acceptance.parsers.startup_log import scan_startup_log
from vllm_acceptance.rules.launch_triage import classify_launch_failure
from vllm_acceptance.runtime.metrics import MetricsError, cache_config, parse_exposition

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "fixtures" / "real"
PROFILE = load_profile(ROOT / "tests/fixtures/profiles/kimi-k3-8gpu-node.yml")
ABSENT = "<the parser has no such field>"


def _a(obj: Any, name: str) -> Any:
    """A field of a parser result; ABSENT where this version of the parser lacks it (so that
    benchmarks/real_corpus.py can score an older checkout of the package too)."""
    value = getattr(obj, name, ABSENT)
    return value() if callable(value) else value


@dataclass
class Entry:
    path: Path              # the artefact
    meta: dict[str, Any]    # its YAML: kind, source, licence, trimmed, expect

    @property
    def kind(self) -> str:
        return str(self.meta["kind"])

    @property
    def name(self) -> str:
        return f"{self.path.parent.name}/{self.path.name}"


@dataclass
class Outcome:
    entry: Entry
    mismatches: list[str] = field(default_factory=list)
    misreadings: list[str] = field(default_factory=list)   # mismatches other than fields the parser lacks

    @property
    def ok(self) -> bool:
        return not self.mismatches


def entries() -> list[Entry]:
    """Every artefact with its YAML beside it (same stem)."""
    found = []
    for meta_path in sorted(REAL.glob("*/*.yml")):
        candidates = [p for p in meta_path.parent.glob(meta_path.stem + ".*") if p.suffix != ".yml"]
        if len(candidates) != 1:
            raise AssertionError(f"{meta_path}: expected exactly one artefact beside it, found {candidates}")
        found.append(Entry(candidates[0], yaml.safe_load(meta_path.read_text())))
    return found


def _same(expected: Any, actual: Any, lenient: bool = False) -> bool:
    """Equal (floats to 1e-6); `lenient`: a field this parser version lacks counts as equal."""
    if lenient and actual is ABSENT:
        return True
    if isinstance(expected, float) or isinstance(actual, float):
        if expected is None or actual is None:
            return expected is actual
        return math.isclose(float(expected), float(actual), rel_tol=1e-6, abs_tol=1e-9)
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(k in actual and _same(v, actual[k], lenient)
                                                for k, v in expected.items())
    if isinstance(expected, list):
        return isinstance(actual, list) and len(expected) == len(actual) \
            and all(_same(e, a, lenient) for e, a in zip(expected, actual, strict=True))
    return bool(expected == actual)


def _len(value: Any) -> Any:
    return ABSENT if value is ABSENT else len(value)


def _bool(value: Any) -> Any:
    return ABSENT if value is ABSENT else bool(value)


def _vllm_log(text: str) -> dict[str, Any]:
    scan = scan_startup_log(text)
    observed: dict[str, Any] = {
        "version": scan.version, "model": scan.model, "platform": scan.platform, "ready": scan.ready,
        "non_default_args": scan.non_default_args, "kv_cache_tokens": scan.kv_cache_tokens,
        "max_concurrency": scan.max_concurrency, "max_concurrency_len": scan.max_concurrency_len,
        "kv_cache_gpu_blocks": _a(scan, "kv_cache_gpu_blocks"), "kv_cache_cpu_blocks": _a(scan, "kv_cache_cpu_blocks"),
        "weights_load_s": scan.weights_load_s, "engine_init_s": scan.engine_init_s,
        "model_load_gib": scan.model_load_gib, "model_load_s": scan.model_load_s,
        "world_size": scan.world_size, "dist_backend": scan.dist_backend, "dp_size": scan.dp_size,
        "warnings": len(scan.warnings), "errors": len(scan.error_lines),
        "backend_fallbacks": len(scan.backend_fallbacks), "nccl_errors": len(scan.nccl_errors),
        "dmabuf_errors": len(scan.dmabuf_errors), "dmabuf_mentions": _len(_a(scan, "dmabuf_mentions")),
        "traceback": scan.traceback, "engine_failed": scan.engine_failed,
        "unsupported_gpu_arch": _bool(_a(scan, "unsupported_gpu_arch")), "no_platform": _bool(_a(scan, "no_platform")),
        "usage_error": _bool(_a(scan, "usage_errors")), "failure_class": scan.failure_class(),
    }
    finding = classify_launch_failure(text, [], PROFILE)
    triage = {"class": finding.observed.get("class"), "rule": finding.observed.get("rule"),
              "status": finding.status.value}
    for key in ("max_model_len", "kv_needed_gib", "kv_available_gib", "estimated_max_model_len", "kv_cache_tokens"):
        if key in finding.observed:
            triage[key] = finding.observed[key]
    observed["triage"] = triage
    return observed


def _xml(text: str) -> dict[str, Any]:
    result = parse_xml(text)
    return {"dtd": _a(result, "dtd_version"), "driver_version": result.driver_version,
            "driver_branch": _a(result, "driver_branch"), "cuda_version": result.cuda_version,
            "attached_gpus": result.attached_gpus, "complete": result.ok,
            "gpus": [{"index": g.index, "name": g.name, "minor_number": _a(g, "minor_number"),
                      "pci_bus_id": g.pci_bus_id, "memory_total_mib": g.memory_total_mib,
                      "fabric_state": g.fabric_state, "fabric_status": _a(g, "fabric_status"),
                      "fabric_clique_id": _a(g, "fabric_clique_id"),
                      "fabric_cluster_uuid": _a(g, "fabric_cluster_uuid"),
                      "fabric_bandwidth": _a(g, "fabric_bandwidth")} for g in result.gpus]}


def _csv(text: str) -> dict[str, Any]:
    result = parse_query_csv(text)
    return {"gpu_count": result.count, "driver_version": result.driver_version,
            "driver_branch": _a(result, "driver_branch"), "names": sorted(set(result.names)),
            "memory_total_mib": result.gpus[0].memory_total_mib if result.gpus else None, "ok": result.ok}


def _table(text: str) -> dict[str, Any]:
    result = parse_table(text)
    return {"driver_version": result.driver_version, "cuda_version": result.cuda_version, "gpu_count": result.count,
            "pci_bus_ids": [g.pci_bus_id for g in result.gpus], "ok": result.ok}


def _driver(text: str) -> dict[str, Any]:
    result = parse_proc_version(text)
    return {"version": result.version, "branch": result.branch, "open_kernel_module": result.open_kernel_module,
            "gcc": result.gcc}


def _smi_error(text: str) -> dict[str, Any]:
    parse = getattr(nvidia_smi, "parse_smi_failure", None)
    if parse is None:
        return {"failure": ABSENT, "nvml_library_version": ABSENT}
    failure = parse(text)
    return {"failure": failure.kind if failure else None,
            "nvml_library_version": failure.nvml_library_version if failure else None}


def _nccl(text: str) -> dict[str, Any]:
    result = parse_all_reduce_perf(text)
    return {"layout": _a(result, "layout"), "rows": len(result.rows), "avg_busbw": result.avg_busbw,
            "max_busbw": result.max_busbw, "wrong_results": result.wrong_results,
            "max_error": _a(result, "max_error"), "out_of_bounds": result.out_of_bounds, "ranks": result.ranks,
            "hosts": result.hosts}


def _ibv(text: str) -> dict[str, Any]:
    result = parse_ibv_devinfo(text)
    hca_ids = _a(result, "hca_ids")
    unattributed = _a(result, "unattributed_lines")
    return {"devices": ABSENT if hca_ids is ABSENT else sorted(hca_ids),
            "ports": [{"device": p.device, "port": p.port, "state": p.state, "link_layer": p.link_layer}
                      for p in result.ports],
            "active_ports": len(result.active_ports), "devices_without_ports": _a(result, "devices_without_ports"),
            "unattributed_lines": ABSENT if unattributed is ABSENT else unattributed > 0}


def _imex(text: str) -> dict[str, Any]:
    try:
        from vllm_acceptance.rules.node.imex import parse_imex_nodes
    except ImportError:             # an older checkout of the package (benchmarks/real_corpus.py --src)
        return {"nodes": ABSENT, "ready": ABSENT, "domain_state": ABSENT, "versions": ABSENT,
                "broken_links": ABSENT, "ok": ABSENT}
    result = parse_imex_nodes(text)
    return {"nodes": len(result.nodes), "ready": sum(n.state == "READY" for n in result.nodes),
            "domain_state": result.domain_state, "versions": sorted({n.version for n in result.nodes if n.version}),
            "broken_links": len(result.broken_links), "ok": result.ok}


def _metrics(text: str) -> dict[str, Any]:
    try:
        snap = parse_exposition(text, taken=0.0)
    except MetricsError:
        return {"parse_error": True}
    families = sorted(snap.families())
    kv = [f for f in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc") if f in families]
    names = sorted({labels["model_name"] for f in families for labels in snap.labels_of(f) if "model_name" in labels})
    return {"parse_error": False, "families": families, "samples": sum(len(v) for v in snap.samples.values()),
            "kv_usage_family": kv[0] if kv else None, "model_names": names, "cache_config_info": cache_config(snap),
            "engines": snap.engines()}


def _ss(text: str) -> dict[str, Any]:
    """The port of the file's LISTEN lines, read as the node script filters them (roles/preflight/files/
    live_process.py) and as the controller parses them (parsers/live.py)."""
    try:
        from vllm_acceptance.parsers.live import parse_ss_listeners
    except ImportError:             # an older checkout of the package
        return {"port": ABSENT, "listeners": ABSENT}
    node: dict[str, Any] = {}
    exec(compile((ROOT / "roles/preflight/files/live_process.py").read_text(), "live_process.py", "exec"), node)  # noqa: S102
    ports = sorted({x.port for x in parse_ss_listeners(text)})
    port = ports[0] if len(ports) == 1 else None
    lines, _ = node["listening"](text, port) if port is not None else ([], [])
    return {"port": port, "listeners": [{"address": x.address, "port": x.port, "pid": x.pid, "process": x.process}
                                        for x in parse_ss_listeners("\n".join(lines))]}


def _node_script() -> dict[str, Any]:
    """The node script's own functions (roles/preflight/files/live_process.py runs without the package)."""
    node: dict[str, Any] = {}
    exec(compile((ROOT / "roles/preflight/files/live_process.py").read_text(), "live_process.py", "exec"), node)  # noqa: S102
    return node


def _cgroup(text: str) -> dict[str, Any]:
    """/proc/PID/cgroup -> the container of the process, as the package reads it (parsers/live.py) and whether the
    node script's copy reads the same (issue 28 item 3)."""
    try:
        from vllm_acceptance.parsers.live import container_from_cgroup
    except ImportError:             # an older checkout of the package
        return {"engine": ABSENT, "id": ABSENT, "node_script_agrees": ABSENT}
    engine, cid, line = container_from_cgroup(text)
    node = _node_script()["cgroup_container"](text)
    return {"engine": engine, "id": cid, "node_script_agrees": node == (engine, cid, line)}


def _container_inspect(text: str) -> dict[str, Any]:
    """`docker inspect --type container` -> the image the container runs (parsers/live.py and the node script)."""
    try:
        from vllm_acceptance.parsers.live import container_image
    except ImportError:
        return {"image_id": ABSENT, "image_ref": ABSENT, "node_script_agrees": ABSENT}
    image_id, image_ref = container_image(text)
    return {"image_id": image_id, "image_ref": image_ref,
            "node_script_agrees": _node_script()["container_image"](text) == (image_id, image_ref)}


def _crictl_inspect(text: str) -> dict[str, Any]:
    """`crictl inspect` (containerd, CRI-O) -> the image the container runs: image ID, repo digest, reference
    (parsers/live.py `crictl_image` and the node script's copy; docs/sources.md#crictl-inspect)."""
    try:
        from vllm_acceptance.parsers.live import crictl_image
    except ImportError:
        return {"image_id": ABSENT, "image_digest": ABSENT, "image_ref": ABSENT, "node_script_agrees": ABSENT}
    image_id, digest, image_ref = crictl_image(text)
    return {"image_id": image_id, "image_digest": digest, "image_ref": image_ref,
            "node_script_agrees": _node_script()["crictl_image"](text) == (image_id, digest, image_ref)}


def _image_inspect(text: str) -> dict[str, Any]:
    """`docker|podman image inspect` -> its names normalised as docker/distribution does (parsers/image_ref.py:
    docker.io, library/, index.docker.io) and whether the image came from a registry (a RepoDigest)."""
    from vllm_acceptance.parsers.container import parse_image_inspect
    try:
        from vllm_acceptance.parsers.image_ref import digest_hex, parse_reference
    except ImportError:             # an older checkout of the package
        return {k: ABSENT for k in ("repo_tags", "repo_digests", "familiar_digests", "id_is_a_manifest_digest")} | {
            "id": parse_image_inspect(text).id, "registry_digest": bool(parse_image_inspect(text).repo_digests)}
    inspect = parse_image_inspect(text)
    digested = [parse_reference(d) for d in inspect.repo_digests]
    return {"id": inspect.id, "repo_tags": [str(parse_reference(t)) for t in inspect.repo_tags],
            "repo_digests": [str(d) for d in digested], "familiar_digests": [d.familiar for d in digested if d],
            "registry_digest": bool(inspect.repo_digests),
            "id_is_a_manifest_digest": bool(inspect.id) and digest_hex(str(inspect.id)) in
            {digest_hex(str(d.digest)) for d in digested if d and d.digest},
            "architecture": inspect.architecture, "created": inspect.created, "labels": inspect.labels}


def _runtime_info(text: str) -> dict[str, Any]:
    """`crictl info` / `crictl version` (a containerd or CRI-O node without docker, issue 42 item 5) -> the runtime
    facts compat.state_snapshot records (parsers/container.py)."""
    from vllm_acceptance.parsers.container import parse_runtime_info, parse_runtime_version
    parsed = parse_runtime_version(text) if text.lstrip().startswith("Version:") else parse_runtime_info(text)
    return {"runtimes": parsed.runtimes, "default_runtime": parsed.default_runtime,
            "server_version": parsed.server_version, "client_version": parsed.client_version,
            "errors": parsed.errors}


def _spec_decode(text: str) -> dict[str, Any]:
    """Speculative decoding's acceptance as quality.spec_acceptance reads it: vLLM's "SpecDecoding metrics" log
    lines, or a /metrics scrape's spec-decode counters since the server started; judged at the model's default
    floors (core/profile_model.py SpecDecode)."""
    from vllm_acceptance.core.profile_model import SpecDecode
    from vllm_acceptance.probes.quality.spec_acceptance import (
        Acceptance,
        AcceptanceFloor,
        SpecCounts,
        judge_acceptance,
        parse_log_lines,
    )

    if "SpecDecoding metrics" in text:
        acc = parse_log_lines(text, "log")
    else:
        counts = SpecCounts.of(parse_exposition(text, taken=0.0))
        acc = Acceptance.of_counts(counts, "metrics") if counts is not None else None
    if acc is None:
        return {"drafts": None, "mean_acceptance_length": None, "positions": None, "status": None}
    d = SpecDecode()
    floor = AcceptanceFloor(d.min_drafts, float(d.min_acceptance_length), float(d.min_continuation),
                            d.min_position_drafts)
    return {"drafts": round(acc.drafts, 2), "positions": len(acc.rates),
            "mean_acceptance_length": None if acc.mean_length is None else round(acc.mean_length, 2),
            "status": judge_acceptance(acc, floor)[0]}


READERS: dict[str, Callable[[str], dict[str, Any]]] = {
    "vllm_log": _vllm_log, "nvidia_smi_xml": _xml, "nvidia_smi_csv": _csv, "nvidia_smi_table": _table,
    "driver_version": _driver,
    "nvidia_smi_error": _smi_error, "nccl_tests": _nccl, "ibv_devinfo": _ibv, "metrics": _metrics,
    "imex_nodes": _imex, "ss_listeners": _ss, "cgroup_container": _cgroup, "container_inspect": _container_inspect,
    "crictl_inspect": _crictl_inspect, "image_inspect": _image_inspect, "runtime_info": _runtime_info,
    "spec_decode": _spec_decode,
}


def _compare_ports(expected: list[dict[str, Any]], actual: list[dict[str, Any]]) -> bool:
    """Each expected port (by device and number) is read with the expected fields; no extra ports."""
    if len(expected) != len(actual):
        return False
    by_key = {(p["device"], p["port"]): p for p in actual}
    return all((e["device"], e["port"]) in by_key and _same(e, by_key[(e["device"], e["port"])]) for e in expected)


def evaluate(entry: Entry) -> Outcome:
    outcome = Outcome(entry)
    expect = entry.meta.get("expect") or {}
    text = entry.path.read_text(errors="replace")
    try:
        observed = READERS[entry.kind](text)
    except Exception as exc:  # noqa: BLE001 - a crash is an outcome to report, not to hide
        outcome.mismatches.append(f"the reader crashed: {type(exc).__name__}: {exc}")
        outcome.misreadings.append(outcome.mismatches[-1])
        return outcome
    for key, want in expect.items():
        if key not in observed:
            outcome.mismatches.append(f"{key}: the reader has no such field")
            outcome.misreadings.append(outcome.mismatches[-1])
            continue
        got = observed[key]
        if got is ABSENT:
            outcome.mismatches.append(f"{key}: {ABSENT}")
            continue
        lenient = True
        if key == "triage":
            want = dict(want)
            if want.get("class") is None:
                want.setdefault("status", "inconclusive")
        if key == "non_default_args":
            ok = isinstance(got, dict) and _same(want, got)
        elif key == "ports":
            ok = _compare_ports(want, got)
        elif key == "gpus":
            ok = len(want) == len(got) and all(_same(w, g) for w, g in zip(want, got, strict=True))
            lenient = len(want) == len(got) and all(_same(w, g, True) for w, g in zip(want, got, strict=True))
        else:
            ok = _same(want, got)
        if not ok:
            outcome.mismatches.append(f"{key}: expected {want!r}, read {got!r}")
            if key != "gpus" or not lenient:
                outcome.misreadings.append(outcome.mismatches[-1])
    return outcome
