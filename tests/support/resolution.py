"""The lab-only agent resolution the rehearsal profiles use (profiles/rehearsal-gb300.yml): 5 % rates, resolved by
a case set of 60 call cases and 12 others. Tests whose point is not the lab's 1 % resolution send this one."""

from __future__ import annotations

LAB_AGENT_5PCT: dict[str, float | int] = {
    "agent.cases": 60, "agent.other_cases": 12, "agent.turn_budget": 120,
    "thresholds.tool_format_error_rate": 0.05, "thresholds.schema_accuracy_min": 0.95,
}


def as_set_args(settings: dict[str, float | int]) -> tuple[str, ...]:
    """`--set FIELD=VALUE` arguments of the probe CLI."""
    return tuple(arg for field, value in settings.items() for arg in ("--set", f"{field}={value}"))


def apply_to(profile: dict, settings: dict[str, float | int]) -> None:
    """Write dotted profile fields into a profile document."""
    for field, value in settings.items():
        section, name = field.split(".", 1)
        profile[section][name] = value
