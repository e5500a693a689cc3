"""The probe kinds: one line per probe, read by every layer that names probes (docs/architecture.md
"Adding a probe").

A probe's code lives in its own folder `probes/<name>/`, which registers how it runs
(`probes/registry.py`); what the lower layers need to know of it -- its name, the check family its
findings belong to, what a failure means, and the check that stands for its stage when it left no
findings -- is declared here, in `core`, so that the progress lines, the check registry's stages, the
report's required stages, the verdict, the inventory schema, the CLI and the Ansible module all take
the same list without importing the probes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProbeKind:
    """What every layer may know of one probe."""

    name: str             # the stage name: findings/<name>.json, stages/<name>.json, probes/<name>/
    family: str           # the check-id prefix of its findings (`capacity` for the load probe): one of the
                          # five prefixes of report.json's contract (report.schema.json)
    consequence: str      # a core.findings.Consequence value: what it means when the probe breaks or is missing
    stands_for: str       # the check reported `missing` when its stage left no findings (report/build.py)
    summary: str          # one line for `vllm-acceptance probe --help`
    # True: every run sends it and the report requires its stage. False: an opt-in probe, run only when the
    # inventory's `acceptance_probes` names it; then its stage is required like the others (report/build.py).
    required: bool = True
    # The check reported `missing` when the probe stops (probes/run.py); `<family>.probe` unless another probe of
    # the family has that one.
    probe_check: str = ""

    @property
    def stopped_check(self) -> str:
        return self.probe_check or f"{self.family}.probe"


# In the order accept.yml runs them (docs/acceptance.md): cache first on a fresh instance, then the agent
# interface, then load (it fills the cache and the queues).
PROBE_KINDS: tuple[ProbeKind, ...] = (
    ProbeKind("cache", "cache", "rebuild_environment", "cache.reuse",
              "prefix-cache reuse: cold / hot / control over several sessions"),
    ProbeKind("agent", "agent", "block_agent_traffic", "agent.tool_call",
              "agent interface: tool calls, structured output, layers"),
    ProbeKind("load", "capacity", "expand_capacity", "capacity.load",
              "capacity: long prompt, context contract, ramp, soak"),
    # The worked example of docs/architecture.md "Adding a probe": opt-in, after load (the counters have moved).
    # Its findings are in the capacity family: report.json's check ids keep the five prefixes of the contract.
    ProbeKind("metrics", "capacity", "limited_observation", "capacity.alert_series",
              "the server exports every series the generated alerts and dashboard read", required=False,
              probe_check="capacity.metrics_probe"),
    # Stand-in for the quality helper's registration (issue 45 item 3 owns it): the `quality.` family the spec
    # checks register in. The lead keeps the quality branch's line in its place on merge.
    ProbeKind("quality", "quality", "limited_observation", "quality.spec_acceptance",
              "output parity against a reference path; the path checks around it", required=False),
)


def probe_families() -> tuple[str, ...]:
    """The check families the probes' findings belong to, in run order."""
    return tuple(kind.family for kind in PROBE_KINDS)


def probe_names() -> tuple[str, ...]:
    """Every probe's name, in run order."""
    return tuple(kind.name for kind in PROBE_KINDS)


def default_probe_names() -> tuple[str, ...]:
    """The probes a run sends when the inventory's `acceptance_probes` names none: the required ones."""
    return tuple(kind.name for kind in PROBE_KINDS if kind.required)


def probe_kind(name: str) -> ProbeKind:
    """The probe called `name`; KeyError naming the known ones otherwise."""
    for kind in PROBE_KINDS:
        if kind.name == name:
            return kind
    raise KeyError(f"probe {name!r}: unknown (choose one of {', '.join(probe_names())})")
