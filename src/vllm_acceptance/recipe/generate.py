"""A complete profile from the recipe: `vllm-acceptance profile from-recipe RECIPE --hardware H --strategy S`.

Every launch argument and variable carries the recipe field it came from (`launch.provenance`); the facts the
recipe states only in prose, and the acceptance defaults it does not give, come from an acceptance file
(recipes/kimi-k3.acceptance.yml: each prose fact with the sentence it was read from, refused when that sentence
is gone). Node shapes come from the hardware table (src/vllm_acceptance/data/hardware.yml). The output is
deterministic, so a shipped profile can be compared byte for byte with a fresh generation
(tests/unit/test_recipe_generate.py). Site values go in a profile that `extends:` this one (core/profile.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..core.profile import ConfigError, validate_document
from ..hardware import HardwareClass, hardware_class
from .pools import deployment as resolve_any
from .reader import RecipeBundle, load_bundle
from .resolve import Deployment, Selection, structured_image

ROOT = Path(__file__).resolve().parents[3]
DEFAULT_FACTS = ROOT / "recipes" / "kimi-k3.acceptance.yml"


@dataclass(frozen=True)
class Facts:
    """The acceptance file: prose facts (value + quote), outside facts (value + source), defaults."""

    path: Path
    data: dict[str, Any]

    def guide(self, key: str) -> Any:
        return (self.data.get("guide") or {}).get(key)

    def outside(self, key: str) -> Any:
        entry = (self.data.get("outside") or {}).get(key) or {}
        return entry.get("value")

    @property
    def defaults(self) -> dict[str, Any]:
        return dict(self.data.get("defaults") or {})

    def verifier(self, section: str) -> dict[str, tuple[Any, str]]:
        """The vendor verifier's bounds for one profile section (`verifier.<section>`): {field: (value, source)};
        an entry without both a value and a source is refused (every bound names where it comes from)."""
        out: dict[str, tuple[Any, str]] = {}
        for key, entry in ((self.data.get("verifier") or {}).get(section) or {}).items():
            if not isinstance(entry, dict) or "value" not in entry or not str(entry.get("source") or "").strip():
                raise ConfigError(f"acceptance facts {self.path}: field `verifier.{section}.{key}` needs a value and "
                                  "a source, e.g. {value: 0.73, source: \"K2-Vendor-Verifier README ...\"}")
            out[key] = (entry["value"], str(entry["source"]))
        return out

    def spec_decode(self) -> dict[str, tuple[Any, str]]:
        """Speculative decoding's floors (`spec_decode.<field>`, the profile's quality.spec_decode; docs/checks.md
        quality.spec_acceptance): {field: (value, source)}, each with its source as the verifier's bounds."""
        out: dict[str, tuple[Any, str]] = {}
        for key, entry in (self.data.get("spec_decode") or {}).items():
            if not isinstance(entry, dict) or "value" not in entry or not str(entry.get("source") or "").strip():
                raise ConfigError(f"acceptance facts {self.path}: field `spec_decode.{key}` needs a value and a "
                                  "source, e.g. {value: 2.48, source: \"vLLM's K3 launch post ...\"}")
            out[key] = (entry["value"], str(entry["source"]))
        return out


def load_facts(path: str | Path | None = None) -> Facts:
    path = Path(path) if path else DEFAULT_FACTS
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"acceptance facts {path}: cannot read it ({exc.strerror}); pass --facts FILE") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"acceptance facts {path}: must be a mapping (see recipes/kimi-k3.acceptance.yml)")
    return Facts(path=path, data=data)


def quoted_entries(node: Any, where: str = "guide") -> list[tuple[str, dict[str, Any]]]:
    """Every {value, quote} entry under the facts' `guide`, with its dotted place."""
    if isinstance(node, dict) and "quote" in node:
        return [(where, node)]
    if isinstance(node, dict):
        return [e for k, v in node.items() for e in quoted_entries(v, f"{where}.{k}")]
    if isinstance(node, list):
        return [e for i, v in enumerate(node) for e in quoted_entries(v, f"{where}[{i}]")]
    return []


def stale_quotes(bundle: RecipeBundle, facts: Facts) -> list[str]:
    """The prose facts whose sentence the recipe no longer contains."""
    text = bundle.path.read_text()
    return [f"{where}: {entry['quote']!r}" for where, entry in quoted_entries(facts.data.get("guide"))
            if str(entry["quote"]) not in text]


def check_quotes(bundle: RecipeBundle, facts: Facts) -> None:
    stale = stale_quotes(bundle, facts)
    if stale:
        raise ConfigError(f"{facts.path}: the recipe {bundle.path} no longer says what these facts were read from "
                          "(re-read the recipe's guide and update the file):\n  " + "\n  ".join(stale))


def guide_value(facts: Facts, key: str) -> Any:
    entry = facts.guide(key)
    return entry.get("value") if isinstance(entry, dict) else None


def image_of(bundle: RecipeBundle, deployment: Deployment, facts: Facts | None) -> tuple[str | None, str]:
    found = structured_image(bundle, deployment)
    if found:
        return found
    brand = "amd" if deployment.brand == "AMD" else "nvidia"
    entry = ((facts.guide("image") if facts else None) or {}).get(brand) if facts else None
    if isinstance(entry, dict) and str(entry.get("quote")) in bundle.path.read_text():
        return str(entry["value"]), f"guide: {entry['quote']}"
    return None, "the recipe names no image (model.docker_image) and the acceptance facts give none"


def hardware_row(deployment: Deployment) -> HardwareClass:
    row = hardware_class(deployment.selection.hardware)
    if row is None:
        raise ConfigError(f"--hardware {deployment.selection.hardware!r}: no row in the hardware table "
                          "(src/vllm_acceptance/data/hardware.yml): add it with its public source")
    if row.gpus_per_node != deployment.gpus_per_node:
        raise ConfigError(f"hardware {row.key}: the recipe taxonomy gives {deployment.gpus_per_node} GPUs per node, "
                          f"the hardware table {row.gpus_per_node}: reconcile them before generating")
    if row.vendor != "nvidia":
        raise ConfigError(f"hardware {row.key}: vendor {row.vendor}: the profile schema models NVIDIA GPUs only "
                          "(hardware.accelerator)")
    return row


def interconnect(deployment: Deployment, row: HardwareClass) -> str:
    if deployment.nodes > 1:
        return "nvl" if row.nvlink_domain == "mnnvl" else "rdma"
    return "nvlink" if row.nvlink_domain != "none" else "none"


def hardware_section(deployment: Deployment, row: HardwareClass) -> dict[str, Any]:
    return {"accelerator": "nvidia", "class": row.key, "gpu_class": row.gpu_name,
            "gpus_per_node": deployment.gpus_per_node, "min_gpus": deployment.min_gpus,
            "min_nodes": deployment.nodes, "nvswitch": row.nvlink_domain != "none",
            "nvlink_domain": row.nvlink_domain, "fabric_manager": row.fabric_manager,
            "memory_estimate_gb": deployment.variant.get("vram_minimum_gb"),
            "interconnect": interconnect(deployment, row)}


def model_section(bundle: RecipeBundle, deployment: Deployment, facts: Facts) -> dict[str, Any]:
    model = bundle.data.get("model") or {}
    max_len = deployment.arg("--max-model-len")
    tool = deployment.arg("--tool-call-parser")
    reasoning = deployment.arg("--reasoning-parser")
    tasks = (bundle.data.get("meta") or {}).get("tasks") or []
    return {"name": deployment.model_id, "served_name": deployment.model_id,
            "max_model_len": int(max_len.value if max_len and max_len.value else model.get("context_length")),
            "hybrid_cache": bool(facts.outside("hybrid_cache")),
            "multimodal": "multimodal" in tasks and deployment.arg("--language-model-only") is None,
            "tool_call_parser": tool.value if tool else None,
            "reasoning_parser": reasoning.value if reasoning else None,
            "weights_gb": deployment.variant.get("vram_minimum_gb")}


def fit_contract(defaults: dict[str, Any], max_model_len: int) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """The default contract and load, shrunk to what the launch serves when the recipe's --max-model-len is
    below them (a contract over the served length could never be met)."""
    contract = dict(defaults["contract"])
    load = dict(defaults["load"])
    need = int(contract["context_tokens"]) + int(contract["max_output_tokens"])
    if need <= max_model_len:
        return contract, load, None
    contract["context_tokens"] = max_model_len - int(contract["max_output_tokens"])
    ninety_five_pct = contract["context_tokens"] * 95 // 100000 * 1000      # whole thousands
    load["long_prompt_tokens"] = min(int(load["long_prompt_tokens"]), ninety_five_pct)
    note = (f"contract.context_tokens {contract['context_tokens']} and load.long_prompt_tokens "
            f"{load['long_prompt_tokens']}: the defaults shrunk to the recipe's --max-model-len {max_model_len}")
    return contract, load, note


def fit_concurrency(defaults: dict[str, Any], contract: dict[str, Any], load: dict[str, Any],
                    max_num_seqs: int | None, engines: int = 1) -> tuple[dict[str, Any], str | None]:
    """The default concurrency, ramp and agent concurrency, shrunk to what the recipe's --max-num-seqs serves when
    it is below them (a contract the server's own sequence cap queues could never be met). --max-num-seqs applies
    per engine (core/contract.py PER_ENGINE_ARGS): a data-parallel launch serves it once per engine. The agent case
    set is also sent at the contract's concurrency (`agent.under_load`, docs/checks.md), unless the defaults say."""
    max_num_seqs = max_num_seqs * max(1, engines) if max_num_seqs else max_num_seqs
    agent = dict(defaults.get("agent") or {})
    if not max_num_seqs or int(contract["concurrency"]) <= max_num_seqs:
        agent.setdefault("under_load", int(contract["concurrency"]))
        return agent, None
    factors = [step / int(contract["concurrency"]) for step in load["ramp"]]
    contract["concurrency"] = max_num_seqs
    load["ramp"] = sorted({max(1, round(max_num_seqs * f)) for f in factors})
    if "concurrency" in agent:
        agent["concurrency"] = min(int(agent["concurrency"]), max_num_seqs)
    agent["under_load"] = min(int(agent.get("under_load", max_num_seqs)), max_num_seqs)
    served = f" ({max_num_seqs // engines} per engine x {engines} engines)" if engines > 1 else ""
    return agent, (f"contract.concurrency {max_num_seqs}, load.ramp {load['ramp']}, agent.concurrency "
                   f"{agent.get('concurrency')}: the defaults shrunk to the recipe's --max-num-seqs {max_num_seqs}"
                   f"{served}")


def launch_section(deployment: Deployment, facts: Facts) -> dict[str, Any]:
    defaults = facts.defaults.get("launch") or {}
    launch: dict[str, Any] = {key: defaults[key] for key in ("runtime", "port", "ready_timeout_s") if key in defaults}
    if deployment.port is not None:             # a pd_cluster pool's own port (recipe/pools.py take_port)
        launch["port"] = deployment.port[0]
    launch["args"] = [a.render() for a in deployment.args]
    launch["env"] = {k: v[0] for k, v in deployment.env.items()}
    launch["required_flags"] = list(defaults.get("required_flags") or [])
    provenance_args = {a.flag: a.source + (f" (replaces {'; '.join(deployment.replaced[a.flag])})"
                                           if a.flag in deployment.replaced else "") for a in deployment.args}
    provenance_env = {k: v[1] for k, v in deployment.env.items()}
    provenance: dict[str, Any] = {"args": provenance_args, "env": provenance_env}
    if deployment.left_out:
        provenance["left_out"] = dict(deployment.left_out)
    if deployment.nodes > 1:
        launch["multinode"] = {key: entry["value"] for key, entry in (facts.guide("multinode") or {}).items()}
        provenance["multinode"] = {key: f"guide: {entry['quote']}"
                                   for key, entry in (facts.guide("multinode") or {}).items()}
    if deployment.site_env:
        launch["site_env"] = {k: v[0] for k, v in deployment.site_env.items()}
        provenance_env.update({k: f"{v[1]} (a site value: set it in vllm_serve_multinode_env)"
                               for k, v in deployment.site_env.items()})
    launch["provenance"] = provenance
    return launch


def recipe_section(bundle: RecipeBundle, deployment: Deployment, facts: Facts, notes: list[str]) -> dict[str, Any]:
    source = bundle.source
    sel = deployment.selection
    return {"source": str(facts.data.get("recipe_source") or bundle.path.name),
            "status": str(facts.data.get("status") or "pre-release"),
            # when the vendored copy was compared with upstream (SOURCE.yml), else the recipe's own date
            "checked": str(source.get("checked") or (bundle.data.get("meta") or {}).get("date_updated") or ""),
            "commit": bundle.commit, "sha256": bundle.sha256, "file": relative(bundle.path),
            "hardware": sel.hardware, "strategy": sel.strategy, "variant": sel.variant,
            **({"pool": sel.pool} if sel.pool else {}),
            "features": list(deployment.features), "notes": notes}


def relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def build_profile(bundle: RecipeBundle, selection: Selection, facts: Facts, name: str | None = None) -> dict[str, Any]:
    check_quotes(bundle, facts)
    deployment = resolve_any(bundle, selection)
    row = hardware_row(deployment)
    image, image_source = image_of(bundle, deployment, facts)
    if image is None:
        raise ConfigError(f"no image for {selection.hardware}: {image_source}")
    model = model_section(bundle, deployment, facts)
    defaults = facts.defaults
    contract, load, shrink = fit_contract(defaults, model["max_model_len"])
    seqs = deployment.arg("--max-num-seqs")
    agent, fewer = fit_concurrency(defaults, contract, load, int(seqs.value) if seqs and seqs.value else None,
                                   int(deployment.parallel.get("data") or 1))
    notes = [str(n["value"]) for n in guide_value_list(facts, "notes")] + [str(n) for n in facts.outside("notes") or []]
    notes += [f"feature {k} left out: {v}" for k, v in deployment.skipped_features.items()]
    notes += [f"image: {image_source}"] + [n for n in (shrink, fewer) if n]
    bounds = facts.verifier("thresholds")
    notes += [f"thresholds.{key} {value}: {source}" for key, (value, source) in bounds.items()]
    thresholds = {**(defaults.get("thresholds") or {}), **{key: value for key, (value, _) in bounds.items()}}
    spec_bounds = facts.spec_decode()
    notes += [f"quality.spec_decode.{key} {value}: {source}" for key, (value, source) in spec_bounds.items()]
    meta = bundle.data.get("meta") or {}
    pool = f" {selection.pool} pool" if selection.pool else ""
    profile: dict[str, Any] = {
        "name": name or default_name(bundle, selection),
        "description": (f"{meta.get('title', deployment.model_id)} from the official recipe on {row.platform}: "
                        f"{selection.strategy}{pool}, {deployment.nodes} node(s) x {deployment.gpus_per_node} GPUs "
                        f"(generated; site values go in a profile that extends this one)"),
        "experimental": False,
        "recipe": recipe_section(bundle, deployment, facts, notes),
        "model": model,
        "image": {"reference": image, "digest": None, "cuda_major": guide_value(facts, "cuda_major"),
                  "forbidden_tag_suffixes": guide_value(facts, "forbidden_tag_suffixes") or []},
        "vllm": {"min_version": str((bundle.data.get("model") or {}).get("min_vllm_version")),
                 **(defaults.get("vllm") or {})},
        "driver": {"min_branch": guide_value(facts, "driver_min_branch"),
                   "min_version": facts.outside("driver_min_version"),
                   "lts_branches": facts.outside("lts_branches") or []},
        "hardware": hardware_section(deployment, row),
        "parallel": deployment.parallel,
        "launch": launch_section(deployment, facts),
        "contract": contract,
        **({"thresholds": thresholds} if thresholds else {}),
        **{key: defaults[key] for key in ("cache",) if key in defaults},
        "agent": agent,
        "load": load,
        **{key: defaults[key] for key in ("loadgen", "review", "remediation") if key in defaults},
        **({"quality": {"spec_decode": {key: value for key, (value, _) in spec_bounds.items()}}}
           if spec_bounds else {}),
    }
    validate_document(profile, "profile", f"profile generated from {bundle.path}")
    return profile


def build_pd_profile(bundle: RecipeBundle, selection: Selection, facts: Facts, name: str | None = None,
                     nodes: dict[str, int | None] | None = None) -> dict[str, Any]:
    """A pd_cluster deployment as ONE profile: each pool resolved as its own (build_profile with `pool`), joined
    under `pd` with the router (recipe/pools.py deployment_profile), validated as a whole."""
    from dataclasses import replace

    from .pools import POOLS, deployment_profile

    pools = {pool: build_profile(bundle, replace(selection, pool=pool, nodes=(nodes or {}).get(pool)), facts)
             for pool in POOLS}
    port = int((facts.defaults.get("launch") or {}).get("port") or 8000)
    profile = deployment_profile(pools, bundle, selection.strategy, name or default_name(bundle, selection), port)
    validate_document(profile, "profile", f"P/D deployment profile generated from {bundle.path}")
    return profile


def default_name(bundle: RecipeBundle, selection: Selection) -> str:
    """<slug>-<hardware>-<strategy>[-<N>nodes][-<pool>]: the node count only where `--nodes` names one."""
    slug = (bundle.data.get("meta") or {}).get("slug", "model")
    words = [str(slug), selection.hardware, selection.strategy.replace("_", "-")]
    if selection.nodes is not None:
        words.append(f"{selection.nodes}node{'s' if selection.nodes > 1 else ''}")
    return "-".join(words + ([selection.pool] if selection.pool else []))


def guide_value_list(facts: Facts, key: str) -> list[dict[str, Any]]:
    entries = facts.guide(key)
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def command_line(bundle: RecipeBundle, selection: Selection, name: str) -> str:
    words = ["vllm-acceptance profile from-recipe", relative(bundle.path), "--hardware", selection.hardware,
             "--strategy", selection.strategy]
    if selection.variant != "default":
        words += ["--variant", selection.variant]
    for feature in selection.features:
        words += ["--feature", feature]
    if selection.pool:
        words += ["--pool", selection.pool]
    if selection.nodes is not None:
        words += ["--nodes", str(selection.nodes)]
    return " ".join(words + ["--name", name])


class _IndentedDumper(yaml.SafeDumper):
    """Sequences indented under their key, the style yamllint asks of the repository's YAML (ansible-lint)."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def render(profile: dict[str, Any], command: str, facts: Facts) -> str:
    header = [
        "# GENERATED from the official recipe:",
        f"#   {command}",
        "# Do not edit: regenerate (tests/unit/test_recipe_generate.py fails when this file differs from the recipe).",
        "# launch.provenance names the recipe field behind every argument and variable.",
        "# contract, thresholds, cache, agent, load, loadgen, review, remediation: defaults from "
        f"{relative(facts.path)}",
        "# (taken from profiles/kimi-k3.yml as of 2026-12-02), not from the recipe. A site sets its own in a profile",
        f"# with `extends: {profile['name']}` (deep-merged by the profile loader, validated after merging).",
    ]
    body = yaml.dump(profile, Dumper=_IndentedDumper, sort_keys=False, allow_unicode=True, width=120,
                     default_flow_style=False)
    return "---\n" + "\n".join(header) + "\n" + body


def generate(recipe: str | Path, selection: Selection, name: str | None = None,
             facts_path: str | Path | None = None,
             pool_nodes: dict[str, int | None] | None = None) -> tuple[dict[str, Any], str]:
    """The profile of a selection and its text; a pd_cluster strategy without a pool is ONE deployment profile
    (build_pd_profile; `pool_nodes` sizes its pools)."""
    bundle = load_bundle(recipe)
    facts = load_facts(facts_path)
    if selection.pool is None and bundle.strategies.get(selection.strategy, {}).get("deploy_type") == "pd_cluster":
        profile = build_pd_profile(bundle, selection, facts, name, pool_nodes)
        command = command_line(bundle, selection, profile["name"])
        for pool, nodes in (pool_nodes or {}).items():
            if nodes is not None:
                command = command.replace(" --name", f" --{pool}-nodes {nodes} --name")
        return profile, render(profile, command, facts)
    profile = build_profile(bundle, selection, facts, name)
    return profile, render(profile, command_line(bundle, selection, profile["name"]), facts)
