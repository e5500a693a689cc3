"""The report documents: schema, HTML (self-contained, escaped, partial-safe), Markdown, JUnit, writer."""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from vllm_acceptance.report import checklist
from vllm_acceptance.report.render_html import fmt_pct, render_html
from vllm_acceptance.report.render_junit import render_junit
from vllm_acceptance.report.render_md import render_markdown
from vllm_acceptance.report.signoff import CONFIRM_FIELDS
from vllm_acceptance.report.write import ReportInvalid, report_errors, validate_report, write_reports

SAMPLES_PATH = Path(__file__).resolve().parents[1] / "fixtures" / "reports" / "samples.py"
_spec = importlib.util.spec_from_file_location("report_samples", SAMPLES_PATH)
assert _spec and _spec.loader
samples = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(samples)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, Any], str]]:
    """Every sample kind: (run_dir, report dict from the real build_report, rendered HTML)."""
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for kind in samples.KINDS:
        run_dir, report = samples.build(kind, root)
        out[kind] = (run_dir, report, render_html(report))
    return out


# --- no external URL: what a browser could fetch --------------------------------------------------

URL_ATTRS = {"src", "href", "xlink:href", "action", "formaction", "poster", "srcset", "data", "background",
             "cite", "longdesc", "ping", "manifest", "icon"}
SCHEME = re.compile(r"^\s*([A-Za-z][A-Za-z0-9+.-]*:|//)")


class FetchFinder(HTMLParser):
    """Collects every attribute value a browser could load, and <script>/<link>/<iframe> tags."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.bad_tags: list[str] = []
        self.styles: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "link", "iframe", "object", "embed", "base", "img", "video", "audio", "source"):
            self.bad_tags.append(tag)
        self._in_style = tag == "style"
        for name, value in attrs:
            if name in URL_ATTRS and value is not None:
                self.urls.append(value)
            if name == "style" and value:
                self.styles.append(value)

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.styles.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "style":
            self._in_style = False


def external_refs(html: str) -> list[str]:
    finder = FetchFinder()
    finder.feed(html)
    refs = [u for u in finder.urls if SCHEME.match(u) and not u.startswith("#")]
    refs += [f"<{t}>" for t in finder.bad_tags]
    for css in finder.styles:
        refs += re.findall(r"@import[^;]*", css)
        refs += [u for u in re.findall(r"url\(\s*['\"]?([^)'\"]*)", css) if not u.startswith(("#", "data:"))]
    return refs


def test_external_ref_detector_catches_what_it_must() -> None:
    """The no-external-URL assertion below is only as good as this detector."""
    assert external_refs('<img src="http://x/a.png">')
    assert external_refs('<a href="//cdn.example/x">x</a>')
    assert external_refs('<svg><use xlink:href="https://x/s.svg#a"/></svg>')
    assert external_refs("<style>@import 'x.css';</style>")
    assert external_refs("<style>body { background: url(http://x/bg.png) }</style>")
    assert external_refs('<link rel="stylesheet" href="x.css">')
    assert not external_refs('<a href="evidence/serve/startup.log">log</a><a href="#verdict">v</a>')


@pytest.mark.parametrize("kind", samples.KINDS)
def test_html_is_self_contained(built: dict, kind: str) -> None:
    html = built[kind][2]
    assert external_refs(html) == []
    # Not even a namespace or DTD URL from the SVGs: an air-gapped reviewer's proxy logs stay clean.
    for attr_value in re.findall(r'="([^"]*)"', html):
        assert not re.match(r"\s*(https?|ftp|wss?):", attr_value), attr_value


@pytest.mark.parametrize("kind,verdict,title", [
    ("release", "release", "Release"),
    ("limited", "limited_observation", "Limited observation"),
    ("rebuild", "rebuild_environment", "Rebuild environment"),
    ("incomplete", "incomplete", "Incomplete: no decision can be signed"),
    ("early_death", "incomplete", "Incomplete: no decision can be signed"),
    ("experimental", "limited_observation", "Limited observation"),
])
def test_html_banner_and_every_finding(built: dict, kind: str, verdict: str, title: str) -> None:
    _, report, html = built[kind]
    assert report["verdict"] == verdict
    assert f'class="verdict v-{verdict}"' in html
    assert f'<div class="verdict-title">{title}</div>' in html
    assert report["immediate_action"].split(";")[0] in html
    for reason in report["verdict_reasons"]:
        assert reason.replace("'", "&#39;").replace(">", "&gt;") in html
    for f in report["findings"]:
        fid = f"{f['check']}@{f['host']}" if f["host"] else f["check"]
        assert f'id="f-{fid}"' in html, fid
    for section in ("gates", "compat", "findings", "capacity", "cache", "agent", "checklist", "environment",
                    "after-release", "signoff"):
        assert f'<section id="{section}"' in html or f'id="{section}" class=' in html, section


def test_ids_unique_in_html(built: dict) -> None:
    """Inline SVGs share one id space: a duplicate would draw one plot's clip path in another."""
    ids = re.findall(r'\bid="([^"]+)"', built["limited"][2])
    dupes = {i for i in ids if ids.count(i) > 1}
    # Two findings of the same check@host would collide too; the samples have none.
    assert not dupes


def test_html_limited_shows_gates_limits_plots_and_tables(built: dict) -> None:
    html = built["limited"][2]
    assert "OPEN, limited" in html  # agent gate open under the retry policy
    assert "max_num_seqs" in html and "48" in html
    # latency, queue per step, KV / queue over time, memory, cache, agent rates
    assert html.count('<svg role="img" class="plot"') == 6
    for name in ("latency", "queue", "kv", "memory", "cache", "agent"):
        assert f'<figure data-plot="{name}"><svg role="img" class="plot"' in html, name
    assert "Memory timeline per GPU, load stages as bands" in html and "long prompt" in html
    assert "hot a" in html and "control" in html  # cache per-request table
    assert "99.4%" in html  # agent schema accuracy
    # The agent plot shows the bound the verdict used for a judged rate, and what the turns resolve.
    assert "judged: one-sided 95% upper bound 1.54%" in html
    assert "500 answered turns resolve a rate down to 0.0060" in html
    assert "layer: <strong>model</strong>" in html


def test_html_rebuild_matrix_marks_the_failing_node(built: dict) -> None:
    html = built["rebuild"][2]
    row = re.search(r"<th>gb300-node2</th>(.*?)</tr>", html, re.S)
    assert row, "node row missing from the compatibility matrix"
    assert 'class="cell fail"' in row.group(1)
    row1 = re.search(r"<th>gb300-node1</th>(.*?)</tr>", html, re.S)
    assert row1 and "575.57.08" not in row1.group(1)
    assert "BLOCKED" in html


def test_html_incomplete_names_unreachable_and_missing(built: dict) -> None:
    html = built["incomplete"][2]
    assert "unreachable" in html and "gb300-node2" in html
    assert "Missing before anything can be signed" in html
    assert "Not run: the agent stage left no details." in html


def test_html_early_death_renders_not_run(built: dict) -> None:
    html = built["early_death"][2]
    for stage in ("load", "cache", "agent", "serve"):
        assert f"Not run: the {stage} stage left no details." in html
    assert "<svg" not in html


def test_html_experimental_banner_with_lineage(built: dict) -> None:
    report, html = built["experimental"][1], built["experimental"][2]
    assert report["experimental"] is True
    assert "Experimental image: not an acceptance of the official profile" in html
    assert "inference-team" in html and "2026-10-31" in html
    assert "Experimental image" not in built["release"][2]


def test_html_escapes_everything(built: dict) -> None:
    report = copy.deepcopy(built["release"][1])
    evil = "<script>alert(1)</script>"
    report["findings"][0]["observed"] = evil
    report["findings"][0]["host"] = '"><img src=x onerror=alert(2)>'
    report["verdict_reasons"] = [evil]
    report["environment"] = {"note": evil}
    report["stages"]["load"]["memory_timeline"][0]["series"] = evil  # lands inside the SVG
    report["findings"][1]["evidence"] = ["javascript:alert(3)", "../../etc/passwd", "evidence/ok file.txt"]
    html = render_html(report)
    assert "<script" not in html and "<img" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert 'href="javascript:' not in html and 'href="../../etc/passwd"' not in html
    assert 'href="evidence/ok%20file.txt"' in html
    assert external_refs(html) == []


@pytest.mark.parametrize("stages", [
    {},
    {"serve": None, "preflight": None, "cache": None, "load": None, "agent": None},
    {"load": {"steps": [{"concurrency": 8}], "memory_timeline": [{"t": 1.0}]},
     "cache": {"requests": [{"kind": "cold"}]}, "agent": {"cases": [], "rates": {}},
     "preflight": {"hosts": {"n1": None}}, "serve": {"cache_config": None}},
    {"load": {"steps": [{"concurrency": 8, "ttft_p95": None, "meets_slo": None}], "knee": None,
              "stage_bounds": [{"stage": "ramp", "start": 5, "end": 9}],
              "memory_timeline": [{"t": 5, "bytes": 2**31, "series": "rss:vllm"}]}},
])
def test_html_renders_partial_stages(built: dict, stages: dict) -> None:
    report = copy.deepcopy(built["early_death"][1])
    report["stages"] = stages
    html = render_html(report)
    assert "Incomplete" in html and "</html>" in html


def test_html_renders_a_minimal_report() -> None:
    """Only the contract's required fields: a report from a run that recorded almost nothing."""
    report = {"schema_version": "1.0", "inventory": "lab", "profile": "cpu-lab", "run_id": "r1", "started": None,
              "finished": "2026-11-30T00:00:00Z", "verdict": "incomplete", "findings": []}
    validate_report(report)
    html = render_html(report)
    assert "No findings at all" in html and "not stated" in html
    assert render_markdown(report).startswith("# Acceptance: lab / r1")
    ET.fromstring(render_junit(report))


# --- schema ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", samples.KINDS)
def test_built_reports_satisfy_the_schema(built: dict, kind: str) -> None:
    assert report_errors(built[kind][1]) == []


@pytest.mark.parametrize("mutate,field", [
    (lambda r: r.update(verdict="go"), "verdict"),
    (lambda r: r.pop("run_id"), "run_id"),
    (lambda r: r.update(schema_version=1), "schema_version"),
    (lambda r: r["findings"][0].update(check="gpu.count"), "findings.0.check"),
    (lambda r: r["findings"][0].update(status="ok"), "findings.0.status"),
    (lambda r: r["findings"][0].pop("evidence"), "findings.0"),
    (lambda r: r["findings"][0].update(evidence=["/etc/passwd"]), "findings.0.evidence.0"),
    (lambda r: r["findings"][0].update(evidence=["https://example.com/log"]), "findings.0.evidence.0"),
    (lambda r: r["findings"][0].update(evidence=["../other-run/x"]), "findings.0.evidence.0"),
    (lambda r: r["findings"][0].update(check="agent.tool_call", status="fail", layer=None), "findings.0.layer"),
    (lambda r: r["findings"][0].update(check="agent.tool_call", layer="gpu"), "findings.0.layer"),
    (lambda r: r["gates"].update(agent={"reason": "x"}), "gates.agent"),
])
def test_schema_rejects_broken_reports(built: dict, mutate: Any, field: str) -> None:
    report = copy.deepcopy(built["release"][1])
    mutate(report)
    errors = report_errors(report)
    assert any(e.startswith(field) or f"'{field}'" in e for e in errors), errors
    with pytest.raises(ReportInvalid):
        validate_report(report)


def test_schema_accepts_agent_fail_with_layer_and_unknown_top_level_fields(built: dict) -> None:
    report = copy.deepcopy(built["release"][1])
    report["findings"][0].update(check="agent.tool_call", status="fail", layer="parser")
    report["monitoring"] = {"rules": "prometheus/rules.yml"}  # forward compatibility
    assert report_errors(report) == []


# --- markdown and junit ---------------------------------------------------------------------------

def test_markdown_verdict_failing_first_and_signoff(built: dict) -> None:
    md = render_markdown(built["limited"][1])
    assert "**Verdict: `limited_observation` — Limited observation**" in md
    start = md.index("## Findings needing action (2)")
    assert start < md.index("`capacity.ramp`", start) < md.index("## Passed and not applicable")
    assert "[evidence/load/ramp/records.jsonl](evidence/load/ramp/records.jsonl)" in md
    assert "| Reviewer (SRE / platform lead) | ______________ |" in md
    assert "| agent (tool calls) | **open, limited** |" in md
    signed = render_markdown(built["release"][1])
    assert "| Reviewer (SRE / platform lead) | L. Chen (SRE) |" in signed


def test_markdown_cells_cannot_break_the_table(built: dict) -> None:
    report = copy.deepcopy(built["limited"][1])
    report["findings"][0]["observed"] = "a | b\nc"
    md = render_markdown(report)
    assert "a \\| b c" in md


def _case_set_rates(under_load: bool) -> dict[str, Any]:
    """Class rates as the agent probe writes them (probes/agent/rules.py class_rates over judged ones): 40 single cases,
    one broken alone; under load two more break; 10 irrelevance cases, one calls a tool where none fits."""
    from vllm_acceptance.probes.agent.rules import CaseJudgement, class_rates

    def judged(broken: set[str]) -> list[CaseJudgement]:
        ids = [("single", f"single-{i:04d}") for i in range(1, 41)] + [("irrelevance", f"irrelevance-{i:04d}")
                                                                       for i in range(1, 11)]
        return [CaseJudgement(case=c, cls=cls, status=200, check=None, separation=[],  # type: ignore[arg-type]
                              problems=[("arguments invalid", "model")] if c in broken else [],
                              misses=["get_ticket"] if c == "irrelevance-0004" else [],
                              abstained=(c != "irrelevance-0004") if cls == "irrelevance" else None)
                for cls, c in ids]

    rates: dict[str, Any] = {"classes": class_rates(judged({"single-0007"})),
                             "assumptions": "One-sided 95 % Clopper-Pearson bounds over distinct cases."}
    if under_load:
        rates["under_load"] = {"concurrency": 8, "cases": 50, "broke": 2,
                               "classes": class_rates(judged({"single-0007", "single-0012", "single-0031"}))}
    return rates


def test_markdown_shows_the_agent_case_set_per_class_alone_and_under_load(built: dict) -> None:
    report = copy.deepcopy(built["limited"][1])
    agent = report["stages"]["agent"]
    agent["rates"].update(_case_set_rates(under_load=True))
    agent["exchanges"].append({"case": "03-single-0007", "http_status": 200, "finish_reason": "tool_calls",
                               "calls": 1, "valid": False, "evidence": "cases/03-single-0007.json"})
    md = render_markdown(report)
    section = md[md.index("## Agent case set by class"):md.index("## Checklist coverage")]
    assert "| Under load (8 in flight): defects / cases | Rate | 95% upper bound | Worst cases |" in section
    single = next(line for line in section.splitlines() if line.startswith("| `single`"))
    cells = [c.strip() for c in single.strip("|").split("|")]
    assert cells[1:6] == ["40", "1", "2.5%", fmt_pct(agent["rates"]["classes"]["single"]["upper_95"]), "0"]
    assert cells[6:9] == ["3 / 40", "7.5%", fmt_pct(agent["rates"]["under_load"]["classes"]["single"]["upper_95"])]
    # the worst cases with their raw bodies one click away: its own kept file alone, the under-load set's file
    own, loaded = "evidence/agent/cases/03-single-0007.json", "evidence/agent/cases-under-load.json"
    assert f"`single-0007`: [{own}]({own})" in single
    assert f"`single-0012` under load only: [{loaded}]({loaded})" in single
    assert single.count("`single-0007`") == 1  # failed alone and under load: named once, with its own file
    irrelevance = next(line for line in section.splitlines() if line.startswith("| `irrelevance`"))
    assert "| 1 (abstained 9) |" in irrelevance and irrelevance.endswith("| — |")
    assert "Clopper-Pearson" in section and "[evidence/agent/cases.json](evidence/agent/cases.json)" in section
    # the HTML shows the same figures
    html = render_html(report)
    assert "Under load (8 in flight)" in html and "single-0031" in html and "3 / 40" in html


def test_markdown_case_set_alone_has_no_under_load_columns_and_no_case_set_no_section(built: dict) -> None:
    report = copy.deepcopy(built["limited"][1])
    report["stages"]["agent"]["rates"].update(_case_set_rates(under_load=False))
    md = render_markdown(report)
    section = md[md.index("## Agent case set by class"):md.index("## Checklist coverage")]
    assert "Under load" not in section and "cases-under-load.json" not in section
    assert "| `single` | 40 | 1 | 2.5% |" in section
    assert "## Agent case set by class" not in render_markdown(built["limited"][1])


def test_junit_one_case_per_finding_with_status_mapping(built: dict) -> None:
    report = copy.deepcopy(built["limited"][1])
    report["findings"].append({"check": "compat.fabric_manager", "status": "not_applicable", "host": "lab",
                               "observed": None, "expected": None, "evidence": [], "reason": "no NVSwitch"})
    report["findings"].append({"check": "cache.reuse", "status": "inconclusive", "host": None,
                               "observed": "hits rose, \x07 prefill did not drop", "expected": "drop",
                               "evidence": []})
    root = ET.fromstring(render_junit(report).encode())
    suite = root.find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    assert len(cases) == len(report["findings"])
    by_name = {c.get("name"): c for c in cases}
    fail = by_name["capacity.ramp"]
    assert fail.get("classname") == "capacity" and fail.find("failure") is not None
    assert by_name["compat.driver_branch@gb300-node1"].get("classname") == "compat"
    warn = by_name["agent.tool_call"]
    assert warn.find("failure") is None and warn.find("error") is None
    assert "WARN" in (warn.findtext("system-out") or "")
    assert by_name["compat.fabric_manager@lab"].find("skipped") is not None
    assert by_name["cache.reuse"].find("error") is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == \
        (str(len(cases)), "1", "1", "1")
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["verdict"] == "limited_observation"


def test_junit_missing_is_an_error_never_a_pass(built: dict) -> None:
    root = ET.fromstring(render_junit(built["early_death"][1]).encode())
    errors = [c.get("name") for c in root.iter("testcase") if c.find("error") is not None]
    assert sorted(errors) == ["agent.tool_call", "cache.reuse", "capacity.load", "compat.serve"]


# --- writer ---------------------------------------------------------------------------------------

def test_write_reports_writes_four_valid_documents(built: dict) -> None:
    run_dir, report, _ = built["limited"]
    paths = write_reports(run_dir, report)
    assert [p.name for p in paths] == ["report.json", "report.html", "report.md", "junit.xml"]
    assert not list(run_dir.glob(".*.tmp"))
    written = json.loads((run_dir / "report.json").read_text())
    # the verdict records the files it judged in run.json and says so in report.json (issue 42, item 7)
    assert written.pop("run_files")["state"] == "bound"
    assert written == json.loads(json.dumps(report, default=str))
    validate_report(json.loads((run_dir / "report.json").read_text()))
    ET.parse(run_dir / "junit.xml")
    assert external_refs((run_dir / "report.html").read_text()) == []


def test_write_reports_refuses_invalid_and_keeps_previous_files(built: dict) -> None:
    run_dir, report, _ = built["rebuild"]
    write_reports(run_dir, report)
    before = (run_dir / "report.json").read_text()
    broken = copy.deepcopy(report)
    broken["verdict"] = "ship_it"
    with pytest.raises(ReportInvalid, match="verdict"):
        write_reports(run_dir, broken)
    dangling = copy.deepcopy(report)
    dangling["findings"][0]["evidence"] = ["evidence/never-written.txt"]
    with pytest.raises(ReportInvalid, match="never-written"):
        write_reports(run_dir, dangling)
    assert (run_dir / "report.json").read_text() == before


# --- checklist coverage ---------------------------------------------------------------------------

def test_checklist_has_every_source_line() -> None:
    per_source: dict[str, int] = {}
    for item in checklist.CHECKLIST:
        per_source[item.source] = per_source.get(item.source, 0) + 1
        for pattern in item.checks:
            assert pattern.startswith(("compat.", "capacity.", "cache.", "agent.", "interconnect.")) \
                or pattern in checklist.REPORT_CHECKS \
                or pattern.removeprefix("confirm:") in CONFIRM_FIELDS, pattern
    # 000: 19 lines, 001: 10, 003: 14, 004: 16 (counted in seeds/).
    assert per_source == {"000": 19, "001": 10, "003": 14, "004": 16}


def test_checklist_statuses(built: dict) -> None:
    rows = {r.item.ref: r for r in checklist.coverage(built["rebuild"][1])}
    assert rows["000#4"].status == "fail"  # R575 on node2: one failing node fails the line
    assert "compat.driver_branch@gb300-node2" in rows["000#4"].matched
    # A maintenance window is confirmed by a person at sign-off, never by the tool.
    assert (rows["001#2"].status, rows["001#2"].category) == ("to_confirm", "person")
    assert rows["000#11"].status == "missing"  # mapped, but no soak finding: never a pass
    assert (rows["000#19"].status, rows["000#19"].category) == ("to_confirm", "person")  # unsigned
    signed = {r.item.ref: r for r in checklist.coverage(built["release"][1])}
    assert signed["000#19"].status == "pass"
    assert signed["004#16"].status == "pass"  # rollback rehearsal recorded in the sign-off


def test_checklist_owner_line_fails_without_owner(built: dict) -> None:
    report = copy.deepcopy(built["limited"][1])
    for f in report["findings"]:
        if f["status"] == "fail":
            f["owner"] = None
    rows = {r.item.ref: r for r in checklist.coverage(report)}
    assert rows["000#18"].status == "fail"


def test_a_figure_is_reused_for_the_same_data_and_redrawn_when_it_changes() -> None:
    """plots keeps the markup of figures drawn before (a report written again reuses them): the same data gives
    the same markup, a changed value or order a new figure, never the stale one."""
    from vllm_acceptance.report import plots

    steps = [{"concurrency": 8, "max_running": 8, "max_waiting": 0, "max_kv_usage": 0.4},
             {"concurrency": 16, "max_running": 16, "max_waiting": 3, "max_kv_usage": 0.9, "preemptions": 2}]
    first = plots.queue_svg({"steps": steps})
    assert first is not None and plots.queue_svg(copy.deepcopy({"steps": steps})) == first
    changed = copy.deepcopy(steps)
    changed[1]["preemptions"] = 5
    redrawn = plots.queue_svg({"steps": changed})
    assert redrawn is not None and redrawn != first and "5 preempt." in redrawn and "2 preempt." in first
    plots.clear_cache()
    assert plots.queue_svg({"steps": steps}) != first          # drawn again: a new id prefix, the same figure
    assert "2 preempt." in (plots.queue_svg({"steps": steps}) or "")
