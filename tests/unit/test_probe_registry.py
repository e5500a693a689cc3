"""Every layer that names probes takes them from one place (core/probes.py), and every declared probe's
folder registers how it runs (probes/registry.py; docs/architecture.md "Adding a probe")."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from vllm_acceptance.core import probes as kinds
from vllm_acceptance.core.findings import CHECK_PREFIXES, Consequence
from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.probes import registry
from vllm_acceptance.probes.options import ProbeOptions

ROOT = Path(__file__).resolve().parents[2]
NAMES = kinds.probe_names()


def test_every_declared_probe_registers_its_typed_settings_and_run() -> None:
    profile = load_profile(ROOT / "profiles" / "cpu-lab.yml")
    for name in NAMES:
        probe = registry.get(name)
        assert probe.name == name and dataclasses.is_dataclass(probe.config_type)
        opts = ProbeOptions(kind=name, base_url="http://127.0.0.1:1/v1", model="m", out_dir=Path("."), profile=profile)
        cfg = probe.config(opts, {"tools": [], "tasks": {}, "system_prompt": "", "default_environment": ""})
        assert isinstance(cfg, probe.config_type)
    assert [p.name for p in registry.all_probes()] == list(NAMES)


def test_a_profile_override_reaches_the_probe_settings() -> None:
    profile = load_profile(ROOT / "profiles" / "cpu-lab.yml")
    opts = ProbeOptions(kind="cache", base_url="http://x/v1", model="m", out_dir=Path("."), profile=profile,
                        overrides={"cache.sessions": 7})
    assert registry.get("cache").config(opts, {}).sessions == 7


def test_a_declared_probe_without_its_folder_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kinds, "PROBE_KINDS", (*kinds.PROBE_KINDS,
                                               kinds.ProbeKind("warp", "capacity", "expand_capacity", "capacity.load",
                                                               "a probe with no folder")))
    with pytest.raises(KeyError, match="no folder probes/warp/"):
        registry.get("warp")
    with pytest.raises(KeyError, match="unknown .*cache, agent, load, metrics, quality, warp"):
        registry.get("nope")


def test_the_lower_layers_take_the_probes_from_core() -> None:
    from vllm_acceptance import progress
    from vllm_acceptance.report.build import OPT_IN_STAGES, REQUIRED_STAGES
    from vllm_acceptance.rules.registry import STAGES
    from vllm_acceptance.rules.registry import get as get_check

    assert progress.PROBES == NAMES and progress.PIPELINE[3:3 + len(NAMES)] == NAMES
    for kind in kinds.PROBE_KINDS:
        assert kind.name in STAGES and f"{kind.family}." in CHECK_PREFIXES
        stages = REQUIRED_STAGES if kind.required else OPT_IN_STAGES
        assert stages[kind.name] == (kind.stands_for, Consequence(kind.consequence))
        assert kind.name not in (OPT_IN_STAGES if kind.required else REQUIRED_STAGES)
        assert kind.stands_for.startswith(f"{kind.family}.")
        assert get_check(kind.stopped_check).stage == kind.name   # catalogued: a stopped probe is `missing`


def test_the_cli_offers_each_probe() -> None:
    from vllm_acceptance.cli import build_parser

    parser = build_parser()
    probe = next(a for a in parser._subparsers._group_actions[0].choices["probe"]._actions  # noqa: SLF001
                 if a.dest == "kind")
    assert tuple(probe.choices) == NAMES


def test_the_inventory_schema_names_the_same_probes() -> None:
    """The schema is a contract read outside the package: it lists the probes, and stays in step here."""
    schema = ROOT / "src" / "vllm_acceptance" / "schemas" / "inventory.schema.json"
    props = json.loads(schema.read_text())["properties"]
    assert tuple(props["acceptance_probes"]["items"]["enum"]) == NAMES
    assert tuple(props["acceptance_probe_overrides"]["properties"]) == NAMES


def test_the_modules_take_the_probes_from_core() -> None:
    """acceptance_probe's `kind` choices and acceptance_run's `probes` result are core/probes.py's names."""
    tree = ast.parse((ROOT / "plugins" / "modules" / "acceptance_probe.py").read_text())
    kind = next(v for node in ast.walk(tree) if isinstance(node, ast.Dict)
                for k, v in zip(node.keys, node.values, strict=True)
                if isinstance(k, ast.Constant) and k.value == "kind")
    choices = next(v for k, v in zip(kind.keys, kind.values, strict=True) if k.value == "choices")
    assert isinstance(choices, ast.Name) and choices.id == "PROBE_NAMES"
    text = (ROOT / "plugins" / "modules" / "acceptance_probe.py").read_text()
    assert "PROBE_NAMES = list(probe_names())" in text
    assert (ROOT / "plugins" / "modules" / "acceptance_run.py").read_text().count(
        "probes=list(default_probe_names()))") == 2
    assert "['cache', 'agent', 'load']" not in (ROOT / "playbooks" / "probes.yml").read_text()
