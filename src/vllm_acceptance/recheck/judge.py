"""A day-N re-check judged against the signed baseline (issue 46 item 2; docs/recheck-judging.md).

`judge(baseline_dir, today_dir)` compares today's run directory (recheck/run.py collects it, a report.json in the
acceptance report's shape) with the signed acceptance run it re-checks, and returns the re-check's outcome
(recheck/outcome.py). It refuses a baseline that was never signed with a decision that lets traffic through, whose
report.json no longer matches the signed hash, and a today directory of another inventory.

Each difference is a `Drift` naming what changed, the baseline's value, today's and its consequence:

- identity: the reopen triggers' facts (report/reopen.py: image, driver, topology, context limit, recipe), the
  running server's argv flag by flag, its environment (names and values, secrets redacted), the weights it serves
  (core/model_identity.py) and its tool/reasoning parsers. A fired trigger, an identity argument, a parser or a
  capacity argument reopens the acceptance (FLAG_RULES); any other flag or environment change is a drift;
- rates: every rate the acceptance judged with its counts (the agent probe's rates, the cache probe's hot reuse,
  the load's request errors and preemptions, the window's tool-call parse failures) against the baseline's
  interval (Clopper-Pearson, probes/agent/rules.py): provably worse is a regression (`drifted`); a rate past the
  accepted level that is not proven worse, or a sample under MIN_RATE_SAMPLES, is inconclusive (`incomplete`),
  never still accepted (judge_rate says why a re-check does not re-prove the accepted level);
- a check that passed when signed and fails today is a drift; today's missing or inconclusive findings, an
  unreachable node or identity evidence not read today make the re-check `incomplete`.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.argv import parse_flags
from ..core.contract import LIMITING_ARGS
from ..core.model_identity import IDENTITY_ARGS, identity_key
from ..core.profile import ConfigError
from ..core.redact import ENV_READ_PREFIXES, REDACTED, is_secret_name, redact_obj, redact_text
from ..core.rundir import RunDir
from ..parsers.live import live_launch
from ..parsers.node_evidence import load_node_evidence
from ..probes.agent.rules import rate_lower_bound, rate_upper_bound, turns_to_resolve
from ..report.reopen import ACCEPTING_DECISIONS, TRIGGERS, changed_parts, reopen_facts
from ..report.signoff import signed_view
from .outcome import Drift, RecheckOutcome

# Two-sided 95 % interval of a rate: each one-sided bound at 97.5 %. "Held" is judged on the project's one-sided
# 95 % bound (probes/agent/rules.py CONFIDENCE), as the acceptance judged its thresholds.
INTERVAL_CONFIDENCE = 0.975
HELD_CONFIDENCE = 0.95
# Fewer samples of a rate than this and a re-check does not judge it: 0 of 20 still allows 14 % (one-sided 95 %).
MIN_RATE_SAMPLES = 20

# vLLM arguments whose change reopens the acceptance, by the reopen rule that names them (report/reopen.py
# TRIGGERS, docs/recheck-judging.md). Identity arguments (core/model_identity.py IDENTITY_ARGS) reopen as
# `served identity`. Any other flag added, removed or changed is a drift the signed decision still covers.
PARSER_ARGS = ("tool_call_parser", "reasoning_parser", "enable_auto_tool_choice", "tool_parser_plugin",
               "chat_template_content_format")
CONTEXT_ARGS = ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "kv_cache_dtype",
                "enable_prefix_caching", "block_size", "kv_cache_memory_bytes", *LIMITING_ARGS)
TOPOLOGY_ARGS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "data_parallel_size_local",
                 "enable_expert_parallel", "distributed_executor_backend", "decode_context_parallel_size")


@dataclass(frozen=True)
class Rule:
    check: str
    consequence: str
    reason: str


def flag_rule(name: str) -> Rule:
    """The consequence of a changed vLLM argument `name` (underscored, as parse_flags names it)."""
    if (key := identity_key(name)) is not None:
        return Rule("drift.served_model", "reopen",
                    f"reopen rule `served identity` (core/model_identity.py): --{key.replace('_', '-')} "
                    f"{IDENTITY_ARGS[key]}")
    if name in PARSER_ARGS:
        return Rule("drift.parser", "reopen",
                    "reopen rule `served identity`: the tool/reasoning parser is part of the agent interface the "
                    "signed agent checks judged (compat.actual_config.flags); another parser is another interface")
    if name in CONTEXT_ARGS:
        return Rule("drift.serve_args", "reopen",
                    f"reopen rule `context_limit` ({TRIGGERS['context_limit'][1]}): "
                    f"{LIMITING_ARGS.get(name, 'it sets the context or the capacity the acceptance measured')}")
    if name in TOPOLOGY_ARGS:
        return Rule("drift.serve_args", "reopen", f"reopen rule `topology` ({TRIGGERS['topology'][1]})")
    return Rule("drift.serve_args", "drifted",
                "no reopen rule names this argument: a drift the signed decision still covers; review it")


# --- reading a run -------------------------------------------------------------------------------------------


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_report(run_dir: Path, what: str) -> dict[str, Any]:
    path = RunDir(run_dir).report_json
    data = _read_json(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {run_dir}: no readable report.json ({path}); give a run directory "
                          "reports/<inventory>/<run-id> whose report stage ran")
    return data


def signed_baseline(baseline_dir: Path) -> dict[str, Any]:
    """The baseline's sign-off record, or ConfigError naming the fix (never signed, not accepting, changed)."""
    record = signed_view(baseline_dir)
    name = baseline_dir.name
    if record is None:
        raise ConfigError(f"--baseline {baseline_dir}: run {name} was never signed (no signoff.json): a re-check "
                          "judges against a signed acceptance; sign it first (`vllm-acceptance sign "
                          f"{baseline_dir} --reviewer NAME --decision release`) or give the signed run")
    if record.get("decision") not in ACCEPTING_DECISIONS:
        raise ConfigError(f"--baseline {baseline_dir}: run {name} was signed {record.get('decision')!r}, which lets "
                          f"no traffic through (a re-check needs one of {', '.join(ACCEPTING_DECISIONS)}); give "
                          "the inventory's last signed acceptance")
    if not record.get("report_intact"):
        raise ConfigError(f"--baseline {baseline_dir}: report.json no longer matches the sha256 its sign-off holds "
                          f"({record.get('report_sha256')}): the signature does not hold; restore the signed "
                          "report.json or sign the run again")
    return record


def findings_by_check(report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for finding in report.get("findings") or []:
        if isinstance(finding, dict) and finding.get("check"):
            out.setdefault(str(finding["check"]), []).append(finding)
    return out


ARGV_SOURCES = ("evidence/serve/process-args.json", "compat.startup_log non_default_args")


def serve_argv(run_dir: Path, report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The running server's flags by where they were read: its argv (evidence/serve/process-args.json) and the
    startup log's non-default args (compat.startup_log); {} when neither was read."""
    out: dict[str, dict[str, Any]] = {}
    argv = _read_json(RunDir(run_dir).evidence_path("serve", "process-args.json"))
    if isinstance(argv, list) and argv:
        out[ARGV_SOURCES[0]] = parse_flags([str(a) for a in argv])
    for finding in findings_by_check(report).get("compat.startup_log", []):
        observed = finding.get("observed")
        args = observed.get("non_default_args") if isinstance(observed, dict) else None
        if isinstance(args, dict) and args:
            out[ARGV_SOURCES[1]] = dict(args)
    return out


def serve_env(run_dir: Path, report: dict[str, Any]) -> dict[str, str] | None:
    """The serving process's environment per node (the preflight's live_process record); None when unread."""
    found: dict[str, str] = {}
    read = False
    for host in [h for h in report.get("hosts") or [] if isinstance(h, str)]:
        record = load_node_evidence(run_dir, host).get("live_process")
        live = live_launch(record.stdout) if record.present and record.rc == 0 else None
        if live is None or not live[1]:
            continue
        read = True
        for name, value in live[1].items():
            found[name if len(report.get("hosts") or []) == 1 else f"{host}:{name}"] = value
    return found if read else None


def served_identity(report: dict[str, Any]) -> dict[str, Any] | None:
    """What compat.served_model read of the weights: /v1/models ids and roots, the hub revision, config hash."""
    for finding in findings_by_check(report).get("compat.served_model", []):
        observed = finding.get("observed")
        if not isinstance(observed, dict) or not observed.get("v1_models"):
            continue
        cards = sorted((str(c.get("id")), str(c.get("root"))) for c in observed["v1_models"] if isinstance(c, dict))
        config = observed.get("checkpoint_config") if isinstance(observed.get("checkpoint_config"), dict) else {}
        return {"models": [f"{i} ({r})" for i, r in cards], "revision": observed.get("hub_snapshot_revision"),
                "config_sha256": config.get("sha256")}
    return None


# --- rates ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Count:
    """A rate as counts: `events` of `n`; kind `max` (higher is worse) or `min` (an accuracy)."""

    events: int
    n: int
    kind: str = "max"
    threshold: float | None = None

    @property
    def value(self) -> float | None:
        return self.events / self.n if self.n else None

    def interval(self) -> tuple[float, float]:
        return (rate_lower_bound(self.events, self.n, INTERVAL_CONFIDENCE),
                rate_upper_bound(self.events, self.n, INTERVAL_CONFIDENCE))

    def held_bound(self) -> float:
        """One-sided 95 % bound on the bad side (the upper bound of an error rate, the lower of an accuracy)."""
        if self.kind == "max":
            return rate_upper_bound(self.events, self.n, HELD_CONFIDENCE)
        return rate_lower_bound(self.events, self.n, HELD_CONFIDENCE)

    def as_dict(self) -> dict[str, Any]:
        lo, hi = self.interval() if self.n else (None, None)
        return {"events": self.events, "n": self.n, "value": self.value, "kind": self.kind,
                "interval_95": [_round(lo), _round(hi)], "threshold": self.threshold}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 5)


def _int(x: Any) -> int | None:
    return int(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0 else None


def count_of(rate: Any) -> Count | None:
    """A Rate.to_dict() record (probes/agent/rules.py) as counts."""
    if not isinstance(rate, dict):
        return None
    events, n = _int(rate.get("events")), _int(rate.get("n"))
    if events is None or n is None or events > n:
        return None
    threshold = rate.get("threshold") if isinstance(rate.get("threshold"), (int, float)) else None
    return Count(events, n, "min" if rate.get("kind") == "min" else "max", threshold)


def _observed(finding: dict[str, Any]) -> Any:
    return finding.get("observed")


def finding_rates(report: dict[str, Any]) -> dict[str, Count]:
    """Every judged rate with counts in a report's findings, by check id (observed.rate or observed itself)."""
    out: dict[str, Count] = {}
    for check, findings in findings_by_check(report).items():
        for finding in findings:
            observed = _observed(finding)
            if not isinstance(observed, dict):
                continue
            count = count_of(observed.get("rate")) or count_of(observed)
            if count is not None:
                out[check] = count
    return out


def _sum(items: Iterable[dict[str, Any]], *keys: str) -> int:
    return sum(_int(item.get(k)) or 0 for item in items for k in keys)


def load_counts(report: dict[str, Any]) -> dict[str, Count]:
    """The load's request error rate and preemptions per request (capacity.ramp steps, capacity.mixed windows,
    capacity.soak), and the window's counters (stages.window, recheck/run.py) where recorded."""
    by = findings_by_check(report)
    requests = errors = preemptions = 0
    for finding in by.get("capacity.ramp", []):
        steps = [s for s in (_observed(finding) or {}).get("steps") or [] if isinstance(s, dict)] \
            if isinstance(_observed(finding), dict) else []
        requests += _sum(steps, "ok", "errors", "timeouts")
        errors += _sum(steps, "errors", "timeouts")
        preemptions += _sum(steps, "preemptions")
    for finding in by.get("capacity.mixed", []):
        windows = [w for w in (_observed(finding) or {}).get("windows") or [] if isinstance(w, dict)] \
            if isinstance(_observed(finding), dict) else []
        requests += _sum(windows, "requests")
        errors += _sum(windows, "errors", "timeouts")
    for finding in by.get("capacity.soak", []):
        if isinstance(_observed(finding), dict):
            requests += _sum([_observed(finding)], "requests")
            errors += _sum([_observed(finding)], "errors", "timeouts")
    window = window_counters(report)
    requests += _int(window.get("requests")) or 0
    errors += _int(window.get("errors")) or 0
    preemptions += _int(window.get("preemptions")) or 0
    out: dict[str, Count] = {}
    if requests:
        out["error_rate"] = Count(min(errors, requests), requests, "max")
        out["preemptions"] = Count(min(preemptions, requests), requests, "max")
    calls, failures = _int(window.get("tool_calls")), _int(window.get("tool_parse_failures"))
    if calls:
        out["tool_parse_failures"] = Count(min(failures or 0, calls), calls, "max")
    return out


def window_counters(report: dict[str, Any]) -> dict[str, Any]:
    """The server's own counters over the re-check's window (report.json stages.window: requests, errors,
    preemptions, prefix_cache_queries, prefix_cache_hits, tool_calls, tool_parse_failures)."""
    stages = report.get("stages") if isinstance(report.get("stages"), dict) else {}
    window = stages.get("window")
    return window if isinstance(window, dict) else {}


def cache_counts(report: dict[str, Any]) -> dict[str, Count]:
    """cache.hot_reuse as counts (requests whose hits reached the expected reuse); the hit ratio of the load's
    mixed windows is compared as a figure (hit_ratio_floor)."""
    out: dict[str, Count] = {}
    for finding in findings_by_check(report).get("cache.hot_reuse", []):
        rows = [r for r in _observed(finding) or [] if isinstance(r, dict)] \
            if isinstance(_observed(finding), list) else []
        judged = [r for r in rows if isinstance(r.get("hits"), (int, float)) and isinstance(r.get("expected"),
                                                                                              (int, float))]
        if judged:
            out["cache.hot_reuse"] = Count(sum(1 for r in judged if r["hits"] >= r["expected"]), len(judged), "min")
    return out


def hit_ratios(report: dict[str, Any]) -> list[float]:
    """The prefix-cache hit ratio of each window (capacity.mixed) and of the re-check's window."""
    ratios = []
    for finding in findings_by_check(report).get("capacity.mixed", []):
        if isinstance(_observed(finding), dict):
            ratios += [float(w["hit_ratio"]) for w in _observed(finding).get("windows") or []
                       if isinstance(w, dict) and isinstance(w.get("hit_ratio"), (int, float))]
    window = window_counters(report)
    queries, hits = _int(window.get("prefix_cache_queries")), _int(window.get("prefix_cache_hits"))
    if queries:
        ratios.append((hits or 0) / queries)
    return ratios


def all_counts(report: dict[str, Any]) -> dict[str, Count]:
    return {**finding_rates(report), **cache_counts(report), **load_counts(report)}


RATE_CHECKS = {"error_rate": ("drift.error_rate", "request error rate"),
               "preemptions": ("drift.preemptions", "preemptions per request"),
               "tool_parse_failures": ("drift.tool_parse_failures", "tool-call parse failures per tool call")}


def rate_check(name: str) -> tuple[str, str]:
    if name in RATE_CHECKS:
        return RATE_CHECKS[name]
    if name.startswith("cache."):
        return "drift.cache_rate", f"{name} rate"
    if name.startswith("capacity."):
        return "drift.capacity_rate", f"{name} rate"
    return "drift.agent_rate", f"{name} rate"


def judge_rate(base: Count, today: Count) -> tuple[str, str]:
    """('held' | 'regressed' | 'inconclusive' | 'improved', why) of today's rate against the baseline's interval.

    A re-check does not re-prove the accepted level (that takes the acceptance's sample: 0 errors in 299 turns to
    show 1 %); it runs only where the identity is the signed one (a changed identity reopens), so the acceptance's
    proof stands for it, and today's sample looks for a change of behaviour it can prove. Held: not proven worse,
    today's rate not above the accepted level, and at least MIN_RATE_SAMPLES samples; a rate the acceptance judged
    on fewer samples (a mechanism: the cache probe's hot requests) holds when none of today's samples failed; the
    reason states the resolution (the one-sided 95 % bound today's sample shows). A rate above the accepted level
    that is not proven worse, or a sample under MIN_RATE_SAMPLES, is inconclusive (never held)."""
    if not today.n:
        return "inconclusive", "no sample today"
    b_lo, b_hi = base.interval()
    t_lo, t_hi = today.interval()
    worse = (t_lo > b_hi) if base.kind == "max" else (t_hi < b_lo)
    span = f"today {today.events}/{today.n} (95 % interval {t_lo:.4f}-{t_hi:.4f}) vs baseline {base.events}/" \
           f"{base.n} ({b_lo:.4f}-{b_hi:.4f})"
    if worse:
        return "regressed", f"{span}: outside the baseline's interval on the bad side"
    better = (t_hi < b_lo) if base.kind == "max" else (t_lo > b_hi)
    bound = today.held_bound()
    value = today.value or 0.0
    if base.kind == "max":
        level = max(base.held_bound(), base.threshold if base.threshold is not None else 0.0)
        within = value <= level
    else:
        level = min(base.held_bound(), base.threshold if base.threshold is not None else 1.0)
        within = value >= level
    if base.n < MIN_RATE_SAMPLES:
        # a mechanism the acceptance judged on a handful of requests (the cache probe's hot requests, one per
        # session): held when none of today's samples failed, as none did when signed
        bad = today.events if base.kind == "max" else today.n - today.events
        if bad == 0:
            return ("improved" if better else "held"), f"{span}: every one of today's {today.n} sample(s) as signed"
        return "inconclusive", f"{span}: {bad} of today's {today.n} sample(s) failed, not proven worse"
    if today.n < MIN_RATE_SAMPLES:
        return "inconclusive", (f"{span}: {today.n} sample(s) today, under the {MIN_RATE_SAMPLES} a re-check judges "
                                "a rate on")
    if within:
        return ("improved" if better else "held"), (
            f"{span}: not worse than the baseline and within the accepted {level:.4f}; this sample resolves the "
            f"rate to its 95 % bound {bound:.4f} (a change smaller than that is not seen by a re-check)")
    need = turns_to_resolve(level, today.events if base.kind == "max" else today.n - today.events,
                            HELD_CONFIDENCE) if level > 0 else None
    return "inconclusive", (f"{span}: today's rate {value:.4f} is past the accepted level {level:.4f} but not proven "
                            "worse than the baseline" + (f" (about {need} samples needed)" if need else ""))


# --- the judgement -------------------------------------------------------------------------------------------


@dataclass
class Judgement:
    drifts: list[Drift]
    relied: list[str]          # drift `what`s that touch what the signed decision relied on
    missing: list[str]
    details: dict[str, Any]

    def add(self, drift: Drift, relied: bool) -> None:
        self.drifts.append(drift)
        if relied or drift.consequence == "reopen":
            self.relied.append(drift.what)


def _empty(value: Any) -> bool:
    return value is None or value == {} or value == [] or value == ""


FACT_CHECKS = {"image": "drift.image", "driver": "drift.driver", "topology": "drift.topology",
               "context_limit": "drift.context_limit", "recipe": "drift.recipe"}


def judge_facts(base: dict[str, Any], today: dict[str, Any], out: Judgement) -> None:
    """The reopen triggers' facts (report/reopen.py): a changed fact reopens; one not read today is missing."""
    then, now = reopen_facts(base), reopen_facts(today)
    for key, (title, meaning) in TRIGGERS.items():
        was, cur = then[key], now[key]
        if isinstance(was, dict) and isinstance(cur, dict):
            unread = [k for k, v in was.items() if not _empty(v) and _empty(cur.get(k))]
            cur = {**cur, **{k: was[k] for k in unread}}
            out.missing += [f"{title}: {k} not read today" for k in unread]
        elif not _empty(was) and _empty(cur):
            out.missing.append(f"{title}: not read today")
            continue
        if was != cur:
            out.add(Drift(check=FACT_CHECKS[key], what=title, baseline=was, today=cur, consequence="reopen",
                          reason=f"reopen rule `{key}`: {meaning} ({'; '.join(changed_parts(was, cur))})",
                          evidence=["report.json"]), relied=True)


def _shown(name: str, value: Any) -> Any:
    if is_secret_name(name):
        return REDACTED if value is not None else None
    return redact_obj(value) if not isinstance(value, str) else redact_text(value)


def judge_argv(base_dir: Path, today_dir: Path, base: dict[str, Any], today: dict[str, Any], out: Judgement) -> None:
    """The running server's flags, one by one, read the same way in both runs (the argv where both have it)."""
    then, now = serve_argv(base_dir, base), serve_argv(today_dir, today)
    if not then:
        return
    source = next((s for s in ARGV_SOURCES if s in then and s in now), None)
    if source is None:
        out.missing.append(f"the running server's argv: not read today as the baseline read it ({', '.join(then)})")
        return
    out.details["argv_source"] = source
    was, now_flags = then[source], now[source]
    # the model given as a positional argument (`vllm serve MODEL`) in one and as --model in the other is the same
    skip = {"model"} if ("model" in was) != ("model" in now_flags) else set()
    for name in sorted((set(was) | set(now_flags)) - skip):
        a, b = was.get(name), now_flags.get(name)
        if str(a) == str(b):
            continue
        flag = f"--{name.replace('_', '-')}"
        change = "added" if name not in was else "removed" if name not in now_flags else "changed"
        rule = flag_rule(name)
        out.add(Drift(check=rule.check, what=f"{flag}: {change}", baseline=_shown(name, a), today=_shown(name, b),
                      consequence=rule.consequence, reason=rule.reason,
                      evidence=["evidence/serve/process-args.json" if source == ARGV_SOURCES[0] else "report.json"]),
                relied=False)


def judge_env(base_dir: Path, today_dir: Path, base: dict[str, Any], today: dict[str, Any], out: Judgement) -> None:
    was, now = serve_env(base_dir, base), serve_env(today_dir, today)
    if was is None:
        return
    if now is None:
        out.missing.append("the running server's environment: not read today (preflight live_process)")
        return
    for name in sorted(set(was) | set(now)):
        a, b = was.get(name), now.get(name)
        if a == b:
            continue
        bare = name.rsplit(":", 1)[-1]
        engine = bare.startswith(ENV_READ_PREFIXES)
        change = "added" if a is None else "removed" if b is None else "changed"
        reason = ("the engine reads it (core/redact.py ENV_READ_PREFIXES): no reopen rule names it, but the signed "
                  "decision relied on the engine as it ran" if engine else
                  "no reopen rule names it and the engine does not read it: a drift the signed decision covers")
        out.add(Drift(check="drift.environment", what=f"environment {name}: {change}", baseline=_shown(bare, a),
                      today=_shown(bare, b), consequence="drifted", reason=reason,
                      evidence=["evidence/preflight"]), relied=engine)


def judge_served(base: dict[str, Any], today: dict[str, Any], out: Judgement) -> None:
    was, now = served_identity(base), served_identity(today)
    if was is None:
        return
    if now is None:
        out.missing.append("the served weights (compat.served_model /v1/models): not read today")
        return
    if was != now:
        out.add(Drift(check="drift.served_model", what="served weights", baseline=was, today=now,
                      consequence="reopen",
                      reason="reopen rule `served identity` (core/model_identity.py): another checkpoint, revision "
                             f"or config serves ({'; '.join(changed_parts(was, now))})",
                      evidence=["report.json"]), relied=True)


def judge_rates(base: dict[str, Any], today: dict[str, Any], out: Judgement) -> dict[str, str]:
    """Each rate in both runs against the baseline's interval (one measured when signed and not today is missing);
    returns how each was judged, by name."""
    then, now = all_counts(base), all_counts(today)
    if "tool_parse_failures" in now and "tool_parse_failures" not in then and "agent.tool_call" in then:
        # the acceptance counts no parse failures in the log: its format-error rate over the agent turns (turns whose
        # tool call did not parse or validate, agent.tool_call) is the rate the signed decision relied on
        then["tool_parse_failures"] = then["agent.tool_call"]
    judged: dict[str, Any] = {}
    for name in sorted(set(then) & set(now)):
        state, why = judge_rate(then[name], now[name])
        judged[name] = {"baseline": then[name].as_dict(), "today": now[name].as_dict(), "judged": state, "why": why}
        check, what = rate_check(name)
        if state == "regressed":
            out.add(Drift(check=check, what=what, baseline=then[name].as_dict(), today=now[name].as_dict(),
                          consequence="drifted", reason=f"regression: {why}", evidence=["report.json"]), relied=True)
        elif state == "inconclusive":
            out.missing.append(f"{what}: {why}")
    for name in sorted(set(then) - set(now)):
        out.missing.append(f"{rate_check(name)[1]}: measured when signed ({then[name].events}/{then[name].n}), "
                           "not today")
    base_ratios, now_ratios = hit_ratios(base), hit_ratios(today)
    if base_ratios and not now_ratios:
        out.missing.append("prefix-cache hit ratio: measured when signed (capacity.mixed), not today")
    if base_ratios and now_ratios and min(now_ratios) < min(base_ratios):
        out.add(Drift(check="drift.cache_rate", what="prefix-cache hit ratio", baseline=[round(min(base_ratios), 4),
                      round(max(base_ratios), 4)], today=round(min(now_ratios), 4), consequence="drifted",
                      reason="below the lowest window hit ratio the acceptance measured", evidence=["report.json"]),
                relied=True)
    out.details["rates"] = judged
    return {name: str(x["judged"]) for name, x in judged.items()}


def judge_findings(base: dict[str, Any], today: dict[str, Any], rated: dict[str, str], out: Judgement) -> None:
    """Checks that passed when signed and fail today; today's missing/inconclusive findings (incomplete). A check
    whose rate was judged against the baseline's interval (`rated`: check -> judged) is judged there when the rate
    explains it (regressed: a drift already names it; inconclusive: already missing)."""
    then = {c: {f.get("status") for f in fs} for c, fs in findings_by_check(base).items()}
    for check, findings in sorted(findings_by_check(today).items()):
        statuses = {f.get("status") for f in findings}
        explained = rated.get(check) in ("regressed", "inconclusive")
        if "fail" in statuses and then.get(check) and then[check] <= {"pass", "warn", "not_applicable"} \
                and not explained:
            reason = "; ".join(str(f.get("reason") or "") for f in findings if f.get("status") == "fail")[:300]
            out.add(Drift(check="drift.check_status", what=check, baseline=sorted(then[check]),
                          today=sorted(statuses), consequence="drifted",
                          reason=f"passed when signed, fails today: {reason}", evidence=["report.json"]), relied=True)
        elif statuses & {"missing", "inconclusive"} and check not in rated:
            reason = next((str(f.get("reason") or "") for f in findings if f.get("status") in ("missing",
                                                                                               "inconclusive")), "")
            out.missing.append(f"{check}: {'/'.join(sorted(statuses & {'missing', 'inconclusive'}))}"
                               + (f" ({reason[:200]})" if reason else ""))
    for host in today.get("unreachable_hosts") or []:
        out.missing.append(f"node {host}: unreachable")
    covered = set(findings_by_check(today)) | {str(h) for h in today.get("unreachable_hosts") or []}
    out.missing += [f"today's run: {m}" for m in today.get("missing") or []
                    if isinstance(m, str) and m.split("@", 1)[0] not in covered]


def verdict_of(out: Judgement) -> tuple[str, list[str]]:
    reopen = [d for d in out.drifts if d.consequence == "reopen"]
    if reopen:
        return "reopen", [f"{d.what}: {d.reason}" for d in reopen]
    relied = [d for d in out.drifts if d.what in out.relied]
    if relied:
        # what already drifted is certain whatever the missing evidence shows (verdict.py's rule for a failure)
        others = [d for d in out.drifts if d.what not in out.relied]
        return "drifted", ([f"{d.what}: {d.reason}" for d in relied + others]
                           + [f"not shown today: {m}" for m in out.missing])
    if out.missing:
        return "incomplete", [f"not shown today: {m}" for m in out.missing]
    if out.drifts:
        return "drifted", [f"{d.what}: {d.reason}" for d in out.drifts]
    return "still_accepted", ["today's deployment is the signed one and behaves inside the baseline's bounds"]


def _relative(baseline_dir: Path) -> str:
    return f"{baseline_dir.parent.name}/{baseline_dir.name}"


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def judge(baseline_dir: Path, today_dir: Path) -> RecheckOutcome:
    """Today's run directory judged against the signed baseline run (module docstring)."""
    baseline_dir, today_dir = Path(baseline_dir), Path(today_dir)
    if baseline_dir.resolve() == today_dir.resolve():
        raise ConfigError(f"today's re-check {today_dir} is the baseline itself: give the re-check's own run "
                          "directory (recheck/run.py opens one per re-check)")
    record = signed_baseline(baseline_dir)
    base = read_report(baseline_dir, "--baseline")
    today = read_report(today_dir, "today's re-check")
    if today.get("inventory") != base.get("inventory"):
        raise ConfigError(f"today's re-check {today_dir} is of inventory {today.get('inventory')!r}, the baseline "
                          f"{baseline_dir} of {base.get('inventory')!r}: re-check with the baseline's own inventory "
                          f"(-i {base.get('inventory')})")
    out = Judgement(drifts=[], relied=[], missing=[], details={})
    judge_facts(base, today, out)
    judge_argv(baseline_dir, today_dir, base, today, out)
    judge_env(baseline_dir, today_dir, base, today, out)
    judge_served(base, today, out)
    rated = judge_rates(base, today, out)
    judge_findings(base, today, rated, out)
    verdict, reasons = verdict_of(out)
    holds = verdict in ("still_accepted", "drifted") and not out.relied
    out.details.update({"relied_on": out.relied, "baseline_signed": {
        k: record.get(k) for k in ("decision", "reviewer", "signed_at", "report_sha256", "limits")},
        "today_run": today.get("run_id"), "today_verdict": today.get("verdict")})
    return RecheckOutcome(
        verdict=verdict, baseline_run=_relative(baseline_dir), recheck_id=str(today.get("run_id") or today_dir.name),
        started=str(today.get("started") or now_iso()), finished=str(today.get("finished") or now_iso()),
        signed_decision=str(record.get("decision")), signed_decision_holds=holds, drifts=out.drifts,
        reasons=reasons, missing=out.missing, details=redact_obj(out.details))
