"""After a change: did the node come back healthy? Its preflight findings judged against the expected driver
and against the entry preflight (a check that passed before and not after stops the roll)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ...core.findings import Finding, Status

# Node-level checks whose failure after a change stops the roll (everything the node's own
# evidence judges; the NCCL bandwidth, the fabric its all-reduce crossed and the startup log belong to
# later stages).
NODE_CHECKS_SKIPPED_AFTER_CHANGE = {"compat.startup_log", "interconnect.nccl_bandwidth", "interconnect.fabric_path"}
# A rollback returns a node to its recorded (old) driver: these must still hold.
ROLLBACK_REQUIRED = ("compat.driver_module", "compat.gpu_visibility", "compat.fabric_manager",
                     "compat.state_snapshot", "compat.peermem")


# --- after a change: did the node come back healthy? --------------------------------------------

def post_check(findings: Iterable[Finding], host: str, *, expect_version: str | None,
               kind: str = "upgrade", before: Iterable[Finding] | None = None) -> tuple[bool, list[str]]:
    """Judge one node's preflight findings after its change. Upgrade: every node check passes
    (or is not applicable) and the driver is the expected version. Rollback: the node is back on
    its recorded version (compat.driver_branch may fail again: that is where it came from) and
    its module, GPUs, Fabric Manager, peer memory and snapshot neither fail nor lack evidence.
    Both: any check of this node, or of the cluster (host null), that passed in `before` (the entry
    preflight, judged with the cluster's expectations) and does not pass now stops the roll.
    Missing or inconclusive evidence is a failure: a node is never put back on a guess."""
    findings = list(findings)
    own = [f for f in findings if f.host == host and f.check not in NODE_CHECKS_SKIPPED_AFTER_CHANGE]
    problems: list[str] = []
    if not own:
        return False, [f"no preflight findings for {host}"]
    by_check = {f.check: f for f in own}
    driver = by_check.get("compat.driver_branch")
    observed = driver.observed if driver is not None and isinstance(driver.observed, Mapping) else {}
    version = observed.get("version")
    sources = observed.get("sources") or {}
    if expect_version and (version != expect_version or
                           any(v != expect_version for v in (sources.values() if isinstance(sources, Mapping)
                                                             else []))):
        problems.append(f"driver is {version} ({dict(sources) if isinstance(sources, Mapping) else sources}), "
                        f"expected {expect_version} on every source")
    if kind == "rollback":
        # Back on the old driver, the profile's (newer-CUDA) image may be refused by the container
        # runtime again: that leaves the container side inconclusive, exactly as before the upgrade.
        # The host side must still be there (fail or missing stops); the re-run of the existing
        # workload is what proves the old stack works again.
        for check in ROLLBACK_REQUIRED:
            finding = by_check.get(check)
            if finding is not None and finding.status in (Status.FAIL, Status.MISSING):
                problems.append(f"{check} {finding.status.value}: {finding.reason}")
    else:
        for finding in own:
            if finding.status not in (Status.PASS, Status.NOT_APPLICABLE, Status.WARN):
                problems.append(f"{finding.check} {finding.status.value}: {finding.reason}")
    problems.extend(p for p in regressions(before or [], findings, host) if p not in problems)
    return not problems, problems


def regressions(before: Iterable[Finding], after: Iterable[Finding], host: str) -> list[str]:
    """Checks of `host` (and cluster-level ones) that passed before the change and do not pass after.
    A check absent after the change counts: its evidence is gone."""
    def key(f: Finding) -> tuple[str, str | None]:
        return f.check, f.host

    relevant = [f for f in before if f.host in (host, None) and f.check not in NODE_CHECKS_SKIPPED_AFTER_CHANGE
                and f.check != "compat.recipe_record"]
    now = {key(f): f for f in after}
    problems = []
    for finding in relevant:
        if finding.status != Status.PASS:
            continue
        later = now.get(key(finding))
        if later is None:
            problems.append(f"{finding.check} passed before the change and has no finding after it")
        elif later.status != Status.PASS:
            problems.append(f"{finding.check} passed before the change and is {later.status.value} after it: "
                            f"{later.reason}")
    return problems


def checks_summary(findings: Iterable[Finding], host: str) -> dict[str, str]:
    """check -> status of one node's findings and the cluster-level ones (the record's `verified`)."""
    return {f.check if f.host == host else f"{f.check} (cluster)": f.status.value
            for f in findings if f.host in (host, None)}
