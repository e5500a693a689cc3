"""compat.served_model: the model that serves is the profile's model (issue 42, item 1; docs/checks.md).

Read from the running server, never from the command line it was given: ``/v1/models`` (vLLM's ``ModelCard``:
``id`` the name it answers to, ``root`` the model path or id it loaded, ``parent`` set for a LoRA adapter;
vllm/entrypoints/openai/models/serving.py) and its startup log (the ``non-default args`` line: ``model``,
``revision``, ``quantization``, ``hf_overrides``, ``chat_template``, ...; the engine config line's resolved
``quantization`` is recorded). Judged against the profile (core/model_identity.py): the model is ``model.path`` or
``model.name``, the name ``model.served_name``; an identity argument the profile's launch.args do not state is a
difference, one they state is a difference where the server shows another value (``--load-format dummy`` where the
recipe loads fastsafetensors). Any difference fails and names both values;
evidence that cannot be read is missing or inconclusive, never a pass.

A local path names the profile's model when it is the same path, or its last components are the model's name or
relative path (a mounted model cache: ``/models/moonshotai/Kimi-K3``, ``<cache>/tiny-agent``), or it is the
Hugging Face hub cache's snapshot of that id (``.../models--org--name/snapshots/<commit>``). Where the checkpoint
directory is readable on this machine (the lab), its config.json hash is recorded beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.findings import Finding
from ..core.model_identity import IDENTITY_ARGS, changes_weights, hub_revision, identity_key, names_model
from ..core.profile import Profile
from ..parsers.startup_log import StartupScan
from . import registry
from .flag_readings import DIFFERS, read_from_startup_log, requested_flags
from .serve import ServerReports

CHECK = "compat.served_model"


@dataclass
class CheckpointConfig:
    """The served checkpoint's config.json where this machine can read it (sha256 of its bytes)."""

    path: str
    sha256: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "error": self.error}


def accepted_models(profile: Profile) -> list[str]:
    """What the profile names as its model: model.path (what a process launch loads), model.name (what a container
    launch passes and a hub id resolves)."""
    model = profile.model.model
    return [str(m) for m in (model.path, model.name) if m]


def _log_model(scan: StartupScan) -> tuple[str | None, str]:
    if scan.non_default_args and scan.non_default_args.get("model"):
        return str(scan.non_default_args["model"]), "startup log non-default args"
    if scan.engine_config and scan.engine_config.get("model"):
        return str(scan.engine_config["model"]).strip("'\""), "startup log engine config"
    if scan.model:
        return scan.model, "startup log (version line or banner)"
    return None, "startup log"


def _cards(models: Any) -> list[dict[str, Any]] | None:
    entries = models.get("data") if isinstance(models, dict) else None
    if not isinstance(entries, list) or not entries:
        return None
    return [{"id": e.get("id"), "root": e.get("root"), "parent": e.get("parent")} for e in entries
            if isinstance(e, dict)]


def _live(cards: list[dict[str, Any]], accepted: list[str], served_name: str) -> tuple[list[str], list[str]]:
    """(differences, unread) of /v1/models against the profile."""
    differences, unread = [], []
    ids = [str(c["id"]) for c in cards]
    if served_name not in ids:
        differences.append(f"/v1/models serves {', '.join(map(repr, ids))}, not the profile's name {served_name!r} "
                           "(model.served_name)")
    for card in cards:
        if card.get("parent"):
            differences.append(f"/v1/models {card['id']!r} is an adapter (parent {card['parent']!r}, root "
                               f"{card.get('root')!r}) over the weights: not the profile's model")
        elif not card.get("root"):
            unread.append(f"/v1/models {card['id']!r} states no root (the model it loaded)")
        elif not any(names_model(str(card["root"]), a) for a in accepted):
            differences.append(f"/v1/models {card['id']!r} serves root {card['root']!r}, not the profile's model "
                               f"{' / '.join(map(repr, accepted))} (model.path / model.name)")
    return differences, unread


def _from_log(scan: StartupScan | None, accepted: list[str], served_name: str, wanted: dict[str, Any]
              ) -> tuple[list[str], list[str], dict[str, Any]]:
    """(differences, unread, read) of the startup log against the profile."""
    if scan is None or scan.lines == 0:
        return [], ["no startup log: the arguments the server loaded its model with (non-default args) are unread"], {}
    read: dict[str, Any] = {}
    differences, unread = [], []
    model, where = _log_model(scan)
    read["model"] = {"value": model, "source": where}
    if model is None:
        unread.append("the startup log names no model")
    elif not any(names_model(model, a) for a in accepted):
        differences.append(f"{where}: model {model!r}, not the profile's {' / '.join(map(repr, accepted))}")
    if scan.engine_config and "quantization" in scan.engine_config:
        read["engine_quantization"] = scan.engine_config["quantization"]
    args = scan.non_default_args
    if args is None:
        line = scan.non_default_args_line
        unread.append(f"the non-default args line is unreadable: {line.text[:300]}" if line is not None
                      else "the startup log has no non-default args line")
        return differences, unread, read
    overrides: dict[str, Any] = {}
    for key, value in args.items():
        name = identity_key(key)
        if name is None or name == "model" or not changes_weights(name, value):
            continue
        if name in wanted:       # stated by the profile: a difference only where the server shows another value
            reading = read_from_startup_log(name, wanted[name], scan, {})
            if reading.state == DIFFERS:
                differences.append(f"{reading.describe()}: {IDENTITY_ARGS[name]}")
            continue
        if name == "served_model_name":
            names = value if isinstance(value, list) else [value]
            if served_name not in [str(n) for n in names]:
                overrides[key] = value
            continue
        overrides[key] = value
    read["overrides"] = overrides
    differences += [f"startup log non-default args: {k}={v!r} ({IDENTITY_ARGS[identity_key(k) or k]}; the profile "
                    "does not state it)" for k, v in overrides.items()]
    return differences, unread, read


def check_served_model(reports: ServerReports, profile: Profile, host: str | None,
                       checkpoint: CheckpointConfig | None = None, plan: Any = None) -> Finding:
    """The weights the running server loaded (/v1/models root and id, the startup log's model and identity
    arguments) against the profile's model: any difference fails naming both; unread evidence is never a pass."""
    check = registry.get(CHECK)
    accepted, served_name = accepted_models(profile), profile.model.model.served
    wanted = requested_flags(profile, plan)
    evidence = reports.models_evidence + reports.log_evidence
    expected = {"model": accepted, "served_name": served_name,
                "identity_arguments": "none beyond the profile's launch.args (" + ", ".join(sorted(IDENTITY_ARGS))
                                      + "; load_format only as dummy)"}
    cards = _cards(reports.models)
    differences, unread = ([], ["no /v1/models answer with models: the weights the server loaded are unread"]) \
        if cards is None else _live(cards, accepted, served_name)
    log_diff, log_unread, read = _from_log(reports.startup, accepted, served_name, wanted)
    differences += log_diff
    unread += log_unread
    observed: dict[str, Any] = {"v1_models": cards, "startup_log": read,
                                "checkpoint_config": checkpoint.to_dict() if checkpoint else None}
    roots = [str(c["root"]) for c in cards or [] if c.get("root")]
    if revisions := [r for r in map(hub_revision, roots) if r]:
        observed["hub_snapshot_revision"] = revisions
    if differences:
        return check.fail(host, observed=observed, expected=expected, evidence=evidence,
                          reason="the server does not serve the profile's model: " + "; ".join(differences),
                          action="serve the profile's model as its recipe ships it: remove the argument (inventory "
                                 "vllm_serve_extra_args, the attached server's own command line) or point it at the "
                                 "profile's model, restart and re-run; a site that serves other weights writes "
                                 "profiles/<site>.yml (extends the profile) whose model and launch.args state them, "
                                 "and accepts that profile")
    if unread:
        absent = cards is None or reports.startup is None or reports.startup.lines == 0
        why = "; ".join(unread)
        if absent:
            finding = check.missing(host, why, evidence=evidence)
            finding.observed, finding.expected = observed, expected
            return finding
        return check.inconclusive(host, observed=observed, expected=expected, evidence=evidence, reason=why,
                                  action="capture the whole startup log from its first line and /v1/models of the "
                                         "server, and re-run; an unreadable line is a parser gap to report")
    return check.passed(host, observed=observed, expected=expected, evidence=evidence,
                        reason=f"serves {served_name!r} from {', '.join(sorted(set(roots)))}, no identity argument "
                               "beyond the profile's")
