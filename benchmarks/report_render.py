"""Size and speed of the report of a 64-host run: build, render, write, and open it in Chromium; print figures.

Usage (controller venv):

    .venv/bin/python benchmarks/report_render.py [--kind fleet64] [--repeat 3] [--workdir /tmp/report-bench]

The run directory is the `fleet64` sample of tests/fixtures/reports/samples.py: 64 GB300 nodes x 8 GPUs
(512 GPU memory series), three deviating nodes, every stage with details. Printed per repeat:
build_report (read the stages, judge, reopen check), render (HTML with six matplotlib SVG plots),
write (all four documents), and the sizes of report.html and report.json; then the time headless
Chromium takes to load and lay out report.html at 1280 px (--dump-dom, process start included, and
the same for an empty page so the difference is the report's own cost). Nothing here is a timed test.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))


def load_samples():  # noqa: ANN201 - a module object
    spec = importlib.util.spec_from_file_location("samples", REPO / "tests" / "fixtures" / "reports" / "samples.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def chromium_load_s(page: Path, work: Path) -> float | None:
    from support.browser import CHROMIUM, FLAGS

    if not CHROMIUM:
        return None
    start = time.perf_counter()
    subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={work / 'chromium-profile'}", "--window-size=1280,900",
                    "--dump-dom", page.resolve().as_uri()], capture_output=True, timeout=300, check=False)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kind", default="fleet64")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()

    from vllm_acceptance.core.profile import load_profile
    from vllm_acceptance.report import plots
    from vllm_acceptance.report.build import build_report
    from vllm_acceptance.report.render_html import environment, render_html
    from vllm_acceptance.report.write import write_reports

    samples = load_samples()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="report-bench-"))
    run_dir = samples.make_run(args.kind, work / "runs")
    profile = load_profile(samples.profile_for(args.kind, work))
    figures: dict[str, list[float]] = {"build_report": [], "render_html": [], "write_reports": []}
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        report = build_report(run_dir, profile)
        plots.clear_cache()  # time the drawing and the template compile, not what the previous call cached
        environment.cache_clear()
        t1 = time.perf_counter()
        render_html(report)
        plots.clear_cache()
        environment.cache_clear()
        t2 = time.perf_counter()
        write_reports(run_dir, report)
        t3 = time.perf_counter()
        figures["build_report"].append(t1 - t0)
        figures["render_html"].append(t2 - t1)
        figures["write_reports"].append(t3 - t2)
    hosts = len(report.get("hosts") or [])
    series = len({m.get("series") for m in (report["stages"].get("load") or {}).get("memory_timeline") or []})
    print(f"{args.kind}: {hosts} hosts, {len(report['findings'])} findings, {series} memory series, "
          f"verdict {report['verdict']}")
    for name, values in figures.items():
        print(f"  {name:14s} median {statistics.median(values):6.2f} s  (min {min(values):.2f}, "
              f"max {max(values):.2f}, n={len(values)})")
    for name in ("report.html", "report.json", "report.md", "junit.xml"):
        print(f"  {name:14s} {(run_dir / name).stat().st_size / 1024:8.1f} KiB")
    empty = work / "empty.html"
    empty.write_text("<!DOCTYPE html><html><body>empty</body></html>")
    base = [chromium_load_s(empty, work) for _ in range(args.repeat)]
    opened = [chromium_load_s(run_dir / "report.html", work) for _ in range(args.repeat)]
    if None in opened:
        print("  chromium       not installed: open time not measured")
    else:
        print(f"  chromium open  median {statistics.median(opened):6.2f} s at 1280 px (empty page "
              f"{statistics.median(base):.2f} s: the report's own cost ~{statistics.median(opened) - statistics.median(base):.2f} s)")  # noqa: E501
    print(f"  report: {run_dir / 'report.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
