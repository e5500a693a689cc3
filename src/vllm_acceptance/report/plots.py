"""Report plots: matplotlib figures as inline SVG text (no file, no URL, no web font).

Every function takes one stage's document (core/stage_details.py `Details.document()`) that may be partial, and
returns the SVG markup or None when there is nothing to draw: a run that died early still
renders. The markup is cleaned for inlining into HTML: no XML prolog or DOCTYPE (the DTD line
is an http URL), no RDF metadata, no namespace URLs (the HTML parser puts <svg> in the SVG
namespace itself), and element ids prefixed per figure so two figures never share an id.
"""

from __future__ import annotations

import functools
import hashlib
import io
import itertools
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import matplotlib
from matplotlib.figure import Figure

from ..core.stage_details import StageDetails

matplotlib.use("Agg")  # never a display; the Figure API below does not touch pyplot state

RC = {
    "svg.fonttype": "none",          # text stays text: searchable, small, rendered by local fonts
    "svg.hashsalt": "vllm-acceptance",  # stable ids: the same data gives the same file
    "font.family": "sans-serif",
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e3e6ea",
    "grid.linewidth": 0.6,
    "axes.edgecolor": "#8a929b",
    "axes.titlesize": 10,
    "axes.titleweight": "bold",
    "legend.frameon": False,
    "legend.fontsize": 8,
}

COLORS = {"p50": "#4c78a8", "p95": "#f58518", "p99": "#e45756",
          "cold": "#9aa5b1", "hot_a": "#2f9e44", "hot_b": "#74c476", "control": "#e8590c",
          "running": "#4c78a8", "waiting": "#f58518", "kv": "#7048e8", "preempt": "#e03131"}
SERIES_COLORS = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d",
                 "#bab0ac", "#eeca3b"]
_counter = itertools.count(1)
_PLAIN = (str, int, float, bool, type(None))
_CACHE_SIZE = 48  # six figures per report: the last eight reports' figures
_cache: OrderedDict[str, str | None] = OrderedDict()
_cache_lock = threading.Lock()


def _is_plain(value: Any) -> bool:
    """JSON-like data only (what report stages hold): its repr() then names the value exactly."""
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, list | tuple):
        return all(_is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, _PLAIN) and _is_plain(v) for k, v in value.items())
    return False


def _same_data_same_figure(fn: Callable[..., str | None]) -> Callable[..., str | None]:
    """A figure is a pure function of its data: the same data (same values, same order) gives the markup drawn
    before, so a report written again (signed, re-judged, a second document) does not redraw it. Matplotlib's
    drawing is most of a report's write time (benchmarks/report_render.py). Ids stay unique within a report: each
    of its figures has its own name prefix (to_svg)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> str | None:
        if not _is_plain((args, kwargs)):
            return fn(*args, **kwargs)
        key = hashlib.sha256(f"{fn.__name__}:{args!r}:{sorted(kwargs.items())!r}".encode()).hexdigest()
        with _cache_lock:
            if key in _cache:
                _cache.move_to_end(key)
                return _cache[key]
        svg = fn(*args, **kwargs)
        with _cache_lock:
            _cache[key] = svg
            while len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
        return svg

    return wrapper


def clear_cache() -> None:
    """Forget the figures drawn so far (a benchmark that times the drawing calls it between repeats)."""
    with _cache_lock:
        _cache.clear()


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    return None


def clean_svg(svg: str, prefix: str) -> str:
    """Make matplotlib's standalone SVG safe to inline: see the module docstring."""
    svg = re.sub(r"<\?xml[^>]*\?>\s*", "", svg)
    svg = re.sub(r"<!DOCTYPE[^>]*>\s*", "", svg)
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.S)
    svg = re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", svg)
    ids = set(re.findall(r'\bid="([^"]+)"', svg))
    for ident in sorted(ids, key=len, reverse=True):
        svg = svg.replace(f'id="{ident}"', f'id="{prefix}-{ident}"')
        svg = svg.replace(f'href="#{ident}"', f'href="#{prefix}-{ident}"')
        svg = svg.replace(f"url(#{ident})", f"url(#{prefix}-{ident})")
    # Scale with the page instead of a fixed pixel size.
    svg = re.sub(r'<svg([^>]*?)\swidth="[^"]*"\s+height="[^"]*"', r'<svg\1', svg, count=1)
    return svg.replace("<svg", '<svg role="img" class="plot"', 1).strip()


def to_svg(fig: Figure, name: str) -> str:
    buf = io.StringIO()
    with matplotlib.rc_context(RC):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    return clean_svg(buf.getvalue(), f"{name}{next(_counter)}")


def _figure(width: float, height: float, ncols: int = 1) -> tuple[Figure, list[Any]]:
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(width, height), layout="constrained")
        axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def _mark_contract(ax: Any, load: dict[str, Any]) -> None:
    contract = _num(load.get("contract_concurrency"))
    knee = _num(load.get("knee"))
    if contract is not None:
        ax.axvline(contract, color="#495057", linestyle="--", linewidth=1, label=f"contract {contract:g}")
    if knee is not None:
        ax.axvline(knee, color="#2f9e44", linestyle=":", linewidth=1.5, label=f"knee {knee:g}")


def _steps(load: dict[str, Any] | None) -> list[dict[str, Any]]:
    steps = [s for s in (load or {}).get("steps") or [] if isinstance(s, dict)]
    return sorted((s for s in steps if _num(s.get("concurrency")) is not None),
                  key=lambda s: float(s["concurrency"]))


@_same_data_same_figure
def latency_svg(load: dict[str, Any] | None, slo: dict[str, Any] | None = None) -> str | None:
    """TTFT, inter-token and end-to-end p50/p95/p99 per concurrency step, SLO and knee marked."""
    steps = _steps(load)
    if not steps:
        return None
    slo = slo or {}
    panels = [("ttft", "Time to first token (s)", "ttft_p95_s"), ("itl", "Inter-token latency (s)", "itl_p95_s"),
              ("e2e", "End-to-end latency (s)", "e2e_p95_s")]
    with matplotlib.rc_context(RC):
        fig, axes = _figure(11, 3.2, 3)
        xs_all = [float(s["concurrency"]) for s in steps]
        for ax, (key, title, slo_key) in zip(axes, panels, strict=True):
            for pct in ("p50", "p95", "p99"):
                pts = [(float(s["concurrency"]), _num(s.get(f"{key}_{pct}"))) for s in steps]
                pts = [(x, y) for x, y in pts if y is not None]
                if pts:
                    ax.plot(*zip(*pts, strict=True), marker="o", markersize=3.5, color=COLORS[pct], label=pct)
            bad = [(float(s["concurrency"]), _num(s.get(f"{key}_p95"))) for s in steps if s.get("meets_slo") is False]
            bad = [(x, y) for x, y in bad if y is not None]
            if bad:
                ax.plot(*zip(*bad, strict=True), linestyle="none", marker="x", markersize=8, color="#c92a2a",
                        label="misses SLO")
            limit = _num(slo.get(slo_key))
            if limit is not None:
                ax.axhline(limit, color="#c92a2a", linewidth=0.8, alpha=0.6, label=f"SLO p95 {limit:g}s")
            _mark_contract(ax, load or {})
            ax.set_title(title)
            ax.set_xlabel("concurrent sessions")
            ax.set_xticks(xs_all)
            ax.set_ylim(bottom=0)
        if axes[0].get_legend_handles_labels()[0]:
            axes[0].legend(loc="upper left")
        return to_svg(fig, "latency")


@_same_data_same_figure
def queue_svg(load: dict[str, Any] | None) -> str | None:
    """Running and waiting requests (bars) and peak KV-cache usage (line) per step; preemptions noted."""
    steps = _steps(load)
    if not steps:
        return None
    with matplotlib.rc_context(RC):
        fig, (ax,) = _figure(11, 3.0)
        xs = list(range(len(steps)))
        width = 0.38
        running = [_num(s.get("max_running")) or 0 for s in steps]
        waiting = [_num(s.get("max_waiting")) or 0 for s in steps]
        ax.bar([x - width / 2 for x in xs], running, width, color=COLORS["running"], label="max running")
        ax.bar([x + width / 2 for x in xs], waiting, width, color=COLORS["waiting"], label="max waiting")
        ax.set_xticks(xs, [f"{float(s['concurrency']):g}" for s in steps])
        ax.set_xlabel("concurrent sessions (step)")
        ax.set_ylabel("requests")
        ax.set_title("Queue and KV-cache pressure per step")
        kv = ax.twinx()
        kv.grid(False)
        kv_pts = [(x, _num(s.get("max_kv_usage"))) for x, s in zip(xs, steps, strict=True)]
        kv_pts = [(x, y * 100 if y <= 1.0 else y) for x, y in kv_pts if y is not None]
        if kv_pts:
            kv.plot(*zip(*kv_pts, strict=True), color=COLORS["kv"], marker="s", markersize=4, label="max KV usage %")
        kv.set_ylim(0, 105)
        kv.set_ylabel("KV cache usage %")
        kv.spines["right"].set_visible(True)
        for x, s in zip(xs, steps, strict=True):
            pre = _num(s.get("preemptions"))
            if pre:
                ax.annotate(f"{pre:g} preempt.", (x, max(running[x], waiting[x])), textcoords="offset points",
                            xytext=(0, 4), ha="center", color=COLORS["preempt"], fontsize=8)
        handles = ax.get_legend_handles_labels()
        handles2 = kv.get_legend_handles_labels()
        ax.legend(handles[0] + handles2[0], handles[1] + handles2[1], loc="upper left")
        return to_svg(fig, "queue")


def stage_bands(bounds: Any) -> list[tuple[str, float, float]]:
    """Stage bounds with consecutive runs of one stage merged (the soak writes one bound per request batch)."""
    rows = sorted(((str(b.get("stage", "")), float(b["start"]), float(b["end"])) for b in bounds or []
                   if isinstance(b, dict) and _num(b.get("start")) is not None and _num(b.get("end")) is not None),
                  key=lambda r: r[1])
    merged: list[tuple[str, float, float]] = []
    for name, start, end in rows:
        if merged and merged[-1][0] == name:
            merged[-1] = (name, merged[-1][1], max(merged[-1][2], end))
        else:
            merged.append((name, start, end))
    return merged


def _draw_bands(ax: Any, bands: list[tuple[str, float, float]], t0: float) -> None:
    shades = ["#f1f3f5", "#e7f5ff"]
    for i, (name, start, end) in enumerate(bands):
        ax.axvspan(start - t0, end - t0, color=shades[i % 2], zorder=0)
        ax.axvline(start - t0, color="#adb5bd", linewidth=0.7, zorder=1)
        # Three label heights: short stages side by side would overlap.
        ax.text(start - t0, (0.98, 0.90, 0.82)[i % 3], " " + name.replace("_", " "),
                transform=ax.get_xaxis_transform(), va="top", ha="left", fontsize=7.5, color="#495057")


MAX_SERIES = 8


@_same_data_same_figure
def memory_svg(load: dict[str, Any] | None) -> str | None:
    """Memory per GPU (or process RSS in the lab) over the run, with the load stages as bands.

    Up to MAX_SERIES series are drawn one by one; a fleet (64 nodes x 8 GPUs) is drawn as the min-max
    envelope and median of all series, plus the series that deviates most from the median.
    """
    samples = [m for m in (load or {}).get("memory_timeline") or []
               if isinstance(m, dict) and _num(m.get("t")) is not None and _num(m.get("bytes")) is not None]
    if not samples:
        return None
    bands = stage_bands((load or {}).get("stage_bounds"))
    t0 = min([float(m["t"]) for m in samples] + [b[1] for b in bands])
    series: dict[str, list[tuple[float, float]]] = {}
    labels: dict[str, str] = {}
    for m in sorted(samples, key=lambda m: float(m["t"])):
        name = str(m.get("series") or "memory")
        series.setdefault(name, []).append((float(m["t"]) - t0, float(m["bytes"]) / 2**30))
        if m.get("label"):
            labels[name] = str(m["label"])
    with matplotlib.rc_context(RC):
        fig, (ax,) = _figure(11, 3.4)
        _draw_bands(ax, bands, t0)
        if len(series) <= MAX_SERIES:
            for (name, pts), color in zip(sorted(series.items()), itertools.cycle(SERIES_COLORS)):
                label = f"{name} ({labels[name]})" if name in labels else name
                ax.plot(*zip(*pts, strict=True), color=color, linewidth=1.3, label=label, zorder=2)
            title = "Memory timeline per GPU, load stages as bands"
        else:
            _envelope(ax, series)
            title = f"Memory timeline of {len(series)} series (envelope), load stages as bands"
        ax.set_xlabel("seconds since first sample")
        ax.set_ylabel("GiB")
        ax.set_ylim(0, max(y for pts in series.values() for _, y in pts) * 1.25 or 1)
        ax.set_title(title)
        ax.legend(loc="lower right", ncols=min(4, len(series)))  # series is never empty here
        return to_svg(fig, "memory")


def _envelope(ax: Any, series: dict[str, list[tuple[float, float]]]) -> None:
    """Min-max band and median per time bucket, and the series farthest from the median."""
    times = sorted({round(t, 1) for pts in series.values() for t, _ in pts})
    buckets: dict[float, list[float]] = {t: [] for t in times}
    for pts in series.values():
        for t, y in pts:
            buckets[round(t, 1)].append(y)
    lo = [min(buckets[t]) for t in times]
    hi = [max(buckets[t]) for t in times]
    med = [sorted(buckets[t])[len(buckets[t]) // 2] for t in times]
    ax.fill_between(times, lo, hi, color="#a5d8ff", alpha=0.6, label="min-max of all series", zorder=2)
    ax.plot(times, med, color="#1864ab", linewidth=1.3, label="median", zorder=3)
    median_at = dict(zip(times, med, strict=True))

    def distance(pts: list[tuple[float, float]]) -> float:
        return max(abs(y - median_at[round(t, 1)]) for t, y in pts)

    name, pts = max(series.items(), key=lambda kv: distance(kv[1]))
    ax.plot(*zip(*pts, strict=True), color="#e03131", linewidth=1.1, label=f"farthest from median: {name}", zorder=4)


@_same_data_same_figure
def kv_timeline_svg(load: dict[str, Any] | None) -> str | None:
    """KV-cache usage and waiting requests over time (the load probe's /metrics samples), stages as bands."""
    rows = [r for r in (load or {}).get("metrics_timeline") or []
            if isinstance(r, dict) and _num(r.get("t")) is not None]
    if not rows:
        return None
    bands = stage_bands((load or {}).get("stage_bounds"))
    t0 = min([float(r["t"]) for r in rows] + [b[1] for b in bands])
    rows.sort(key=lambda r: float(r["t"]))
    with matplotlib.rc_context(RC):
        fig, (ax,) = _figure(11, 3.2)
        _draw_bands(ax, bands, t0)
        xs = [float(r["t"]) - t0 for r in rows]
        for key, label, color in (("waiting", "waiting requests", COLORS["waiting"]),
                                  ("running", "running requests", COLORS["running"])):
            ys = [_num(r.get(key)) for r in rows]
            pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
            if pts:
                ax.step(*zip(*pts, strict=True), where="post", color=color, linewidth=1.1, label=label, zorder=3)
        ax.set_ylabel("requests")
        ax.set_xlabel("seconds since first sample")
        ax.set_ylim(bottom=0)
        kv = ax.twinx()
        kv.grid(False)
        pts = [(x, (_num(r.get("kv_usage")) or 0.0) * 100) for x, r in zip(xs, rows, strict=True)
               if _num(r.get("kv_usage")) is not None]
        if pts:
            kv.plot(*zip(*pts, strict=True), color=COLORS["kv"], linewidth=1.3, label="KV cache usage %", zorder=4)
        kv.set_ylim(0, 105)
        kv.set_ylabel("KV cache usage %")
        kv.spines["right"].set_visible(True)
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = kv.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, loc="upper right", ncols=3)
        ax.set_title("KV-cache usage and queue over time, load stages as bands")
        return to_svg(fig, "kvtime")


def wilson(successes: float, n: float, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion (honest at n = 3, where the normal one is not)."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


AGENT_RATES = (("schema_accuracy", "schema-valid calls", "triggered"),
               ("trigger_consistency", "consistent tool triggering", "runs"),
               ("format_error_rate", "tool-call format errors", "triggered"),
               ("separation_error_rate", "content / reasoning separation errors", "runs"))


def judged_bound(bound: Any) -> tuple[float | None, float | None, float | None]:
    """(n, lo, hi) of a rate the probe judged (details.rates.bounds): the one-sided 95 % bound the verdict
    used (Clopper-Pearson, probes/agent/rules.py), the other side at the observed rate."""
    if not isinstance(bound, dict):
        return None, None, None
    n, value = _num(bound.get("n")), _num(bound.get("value"))
    upper, lower = _num(bound.get("upper_95")), _num(bound.get("lower_95"))
    if not n or value is None:
        return None, None, None
    if upper is not None:
        return n, value, upper
    return n, lower, value


def agent_rate_rows(agent: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Each agent rate with the count it is measured on and its 95% interval: for a judged rate the
    one-sided bound its verdict used (`judged`), else a two-sided Wilson interval."""
    rates = (agent or {}).get("rates") or {}
    bounds = rates.get("bounds") if isinstance(rates.get("bounds"), dict) else {}
    rows = []
    for key, label, base in AGENT_RATES:
        rate = _num(rates.get(key))
        if rate is None:
            continue
        n, lo, hi = judged_bound(bounds.get(key))
        judged = n is not None
        if not judged:
            n = _num(rates.get(base)) or _num(rates.get("runs"))
            lo, hi = wilson(rate * n, n) if n else (None, None)
        rows.append({"key": key, "label": label, "rate": rate, "n": int(n) if n else None, "lo": lo, "hi": hi,
                     "judged": judged})
    return rows


@_same_data_same_figure
def agent_rates_svg(agent: dict[str, Any] | None, threshold: float | None = None) -> str | None:
    rows = agent_rate_rows(agent)
    if not rows:
        return None
    with matplotlib.rc_context(RC):
        fig, (ax,) = _figure(11, 0.55 * len(rows) + 1.0)
        ys = list(range(len(rows)))[::-1]
        for y, row in zip(ys, rows, strict=True):
            bad = row["key"].endswith("error_rate")
            color = "#e8590c" if bad else "#2f9e44"
            ax.barh(y, row["rate"] * 100, height=0.5, color=color, alpha=0.85)
            if row["lo"] is not None:
                ax.errorbar(row["rate"] * 100, y, xerr=[[max(0.0, row["rate"] - row["lo"]) * 100],
                                                        [max(0.0, row["hi"] - row["rate"]) * 100]],
                            fmt="none", ecolor="#212529", capsize=4, linewidth=1)
            if row["judged"]:
                side = f"upper bound {(row['hi'] or 1) * 100:.2f}%" if bad else \
                    f"lower bound {(row['lo'] or 0) * 100:.2f}%"
                note = f"judged: one-sided 95% {side}"
            else:
                note = f"95% CI {(row['lo'] or 0) * 100:.0f}-{(row['hi'] or 1) * 100:.0f}%"
            ax.text(101, y, f"{row['rate'] * 100:.1f}%  (n={row['n'] or '?'}, {note})", va="center", fontsize=8)
        if threshold is not None:
            ax.axvline(threshold * 100, color="#c92a2a", linestyle="--", linewidth=1,
                       label=f"format error threshold {threshold * 100:g}%")
            ax.legend(loc="lower right")
        ax.set_yticks(ys, [r["label"] for r in rows])
        ax.set_xlim(0, 100)
        ax.set_xlabel("% of calls or runs (bars); whiskers: the judged rates' one-sided 95% bound, else Wilson")
        ax.set_title("Agent interface rates with their confidence intervals")
        return to_svg(fig, "agent")


KIND_ORDER = ("cold", "hot_a", "hot_b", "control")


@_same_data_same_figure
def cache_svg(cache: dict[str, Any] | None) -> str | None:
    """Prefix-cache hits and prefill work per request, grouped by session: cold / hot A / hot B / control."""
    requests = [r for r in (cache or {}).get("requests") or [] if isinstance(r, dict)]
    if not requests:
        return None
    sessions = sorted({int(r.get("session") or 0) for r in requests})
    with matplotlib.rc_context(RC):
        fig, axes = _figure(11, 3.2, 2)
        width = 0.2
        for ax, key, title in ((axes[0], "hits", "Prefix-cache hits (tokens)"),
                               (axes[1], "prefill_computed_tokens", "Prefill tokens computed")):
            for k, kind in enumerate(KIND_ORDER):
                xs, ys = [], []
                for i, session in enumerate(sessions):
                    match = [r for r in requests if int(r.get("session") or 0) == session and r.get("kind") == kind]
                    value = _num(match[0].get(key)) if match else None
                    if value is not None:
                        xs.append(i + (k - 1.5) * width)
                        ys.append(value)
                if xs:
                    ax.bar(xs, ys, width, color=COLORS[kind], label=kind.replace("_", " "))
                if key == "hits":
                    exp = [(i + (k - 1.5) * width, _num(m[0].get("expected_hits")))
                           for i, session in enumerate(sessions)
                           for m in [[r for r in requests if int(r.get("session") or 0) == session
                                      and r.get("kind") == kind]] if m]
                    exp = [(x, y) for x, y in exp if y is not None]
                    if exp:
                        ax.plot(*zip(*exp, strict=True), linestyle="none", marker="_", markersize=14,
                                markeredgewidth=2, color="#212529",
                                label="expected (block-aligned)" if kind == "cold" else None)
            ax.set_xticks(range(len(sessions)), [f"session {s}" for s in sessions])
            ax.set_title(title)
        expected = _num((cache or {}).get("expected_hot_hits"))
        if expected is not None:
            axes[0].axhline(expected, color="#2b8a3e", linestyle="--", linewidth=1,
                            label=f"block-aligned shared prefix {expected:g}")
        for ax in axes:
            top = ax.get_ylim()[1]
            ax.set_ylim(0, top * 1.3 if top > 0 else 1)  # headroom for the legend above the bars
        if axes[0].get_legend_handles_labels()[0]:
            axes[0].legend(loc="upper left", ncols=3)
        return to_svg(fig, "cache")


def all_svgs(stages: StageDetails, slo: dict[str, Any] | None = None,
             format_threshold: float | None = None) -> dict[str, str | None]:
    """Every figure of the report, each drawn from its stage's document (plain data: the figure cache's key)."""
    load, cache, agent = (part.document() if part else None for part in (stages.load, stages.cache, stages.agent))
    return {"latency": latency_svg(load, slo), "queue": queue_svg(load), "kv": kv_timeline_svg(load),
            "memory": memory_svg(load), "cache": cache_svg(cache), "agent": agent_rates_svg(agent, format_threshold)}

