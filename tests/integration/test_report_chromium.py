"""report.html in a real browser (Debian chromium, headless): it renders, fits, and it fetches nothing.

At 1280 px (a laptop screen), the lab report (real vLLM, signed with an override, reopened, restore
rehearsed: tests/support/story.py) and a 64-host sample report must not overflow horizontally
(`scrollWidth <= innerWidth`), must hold every section, and must draw every plot (matplotlib inline
SVG with drawn paths). Screenshots are kept under reports/screenshots/ (ignored by git; set
REPORT_SCREENSHOTS_DIR to move them); each test prints where.

Chromium's own background traffic (component updater, time sync, account list) shows in the
net log with initiator "not an origin"; a request made by the page carries the page's origin
(`null` / `file://` for a file). A positive control page with an external image, stylesheet and
CSS background proves the net-log check sees page requests before the report is judged by it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from vllm_acceptance.report.write import write_reports

from support.browser import measure
from support.browser import screenshot as browser_screenshot

pytestmark = pytest.mark.chromium

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
if CHROMIUM is None:
    pytest.skip("Debian chromium is not installed (apt-get install -y chromium)", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("REPORT_SCREENSHOTS_DIR") or REPO / "reports" / "screenshots")
SAMPLES_PATH = Path(__file__).resolve().parents[1] / "fixtures" / "reports" / "samples.py"
_spec = importlib.util.spec_from_file_location("report_samples_chromium", SAMPLES_PATH)
assert _spec and _spec.loader
samples = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(samples)

# Verdict banner colours of report.css: the screenshot must show the one of its verdict.
BANNER_RGB = {"limited_observation": (0xB3, 0x59, 0x00), "incomplete": (0x42, 0x4A, 0x53)}


def screenshot(page: Path, work: Path, height: int = 3000) -> tuple[Path, Path]:
    """Render `page` headless; returns (png, net log). Bounded in time; fails loudly with stderr."""
    png, netlog = work / f"{page.stem}.png", work / f"{page.stem}.netlog.json"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-extensions", "--hide-scrollbars", f"--user-data-dir={work / 'profile'}",
           f"--log-net-log={netlog}", "--net-log-capture-mode=Everything",
           f"--screenshot={png}", f"--window-size=1400,{height}", page.resolve().as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)
    assert png.is_file(), f"chromium wrote no screenshot (rc {proc.returncode}): {proc.stderr[-2000:]}"
    assert netlog.is_file(), "chromium wrote no net log"
    return png, netlog


def page_requests(netlog: Path) -> list[str]:
    """URLs of network requests started on behalf of the page (not chromium's own background jobs)."""
    text = netlog.read_text()
    if not text.rstrip().endswith("}"):  # a log cut short by exit still lists its events line by line
        text = text.rstrip().rstrip(",") + "]}"
    log = json.loads(text)
    names = {v: k for k, v in log["constants"]["logEventTypes"].items()}
    urls = []
    for event in log["events"]:
        params: dict[str, Any] = event.get("params") or {}
        started = names.get(event["type"]) == "URL_REQUEST_START_JOB" and "url" in params
        if started and params.get("initiator") != "not an origin":
            urls.append(str(params["url"]))
    return urls


def colours(png: Path) -> tuple[int, set[tuple[int, int, int]]]:
    from PIL import Image  # Pillow comes with matplotlib

    with Image.open(png) as img:
        rgb = img.convert("RGB")
        counted = rgb.getcolors(maxcolors=rgb.width * rgb.height) or []
        # Colours covering at least 200 pixels: solid areas (banner, pills), not anti-aliasing.
        solid = {tuple(colour) for count, colour in counted if count >= 200}
        return len(counted), solid  # type: ignore[return-value]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chromium")


def test_net_log_check_sees_page_requests(work: Path) -> None:
    """Positive control: external references in a page do show up as page requests."""
    page = work / "control.html"
    page.write_text('<!DOCTYPE html><html><head><link rel="stylesheet" href="https://fonts.example.invalid/a.css">'
                    "<style>body{background:url(http://127.0.0.1:9/bg.png)}</style></head>"
                    '<body><img src="http://127.0.0.1:9/x.png"><p>control</p></body></html>')
    _, netlog = screenshot(page, work, height=600)
    urls = page_requests(netlog)
    assert "http://127.0.0.1:9/x.png" in urls and "https://fonts.example.invalid/a.css" in urls


@pytest.mark.parametrize("kind", ["limited", "early_death"])
def test_report_renders_and_fetches_nothing(work: Path, kind: str) -> None:
    run_dir, report = samples.build(kind, work / "runs")
    write_reports(run_dir, report)
    png, netlog = screenshot(run_dir / "report.html", work / kind)
    assert page_requests(netlog) == []
    distinct, solid = colours(png)
    assert distinct > 200, f"screenshot looks blank: {distinct} distinct colours"
    want = BANNER_RGB[report["verdict"]]
    assert any(all(abs(a - b) <= 3 for a, b in zip(px, want, strict=True)) for px in solid), \
        f"verdict banner colour {want} not in the screenshot"
    # Keep the picture for a human look: the report's own directory, beside report.html.
    shutil.copy(png, run_dir / "report-screenshot.png")


SECTIONS = ["verdict", "first-screen", "gates", "compat", "findings", "capacity", "cache", "agent", "checklist",
            "environment", "after-release", "signoff"]


def check_in_browser(page: Path, name: str, plots: list[str]) -> dict[str, Any]:
    """Measure at 1280 px, assert the layout, keep a first-screen and a full-page screenshot."""
    m = measure(page, SHOTS / name)
    assert m["innerWidth"] == 1280
    assert m["scrollWidth"] <= m["innerWidth"], f"horizontal overflow: {m['overflowing']}"
    missing = [s for s in SECTIONS if s not in m["sections"]]
    assert not missing, f"sections missing: {missing}"
    drawn = {p["name"]: p for p in m["plots"]}
    for plot in plots:
        assert plot in drawn, f"plot {plot} not in the page ({sorted(drawn)})"
        assert drawn[plot]["width"] > 600 and drawn[plot]["height"] > 150 and drawn[plot]["paths"] > 10, drawn[plot]
    first = browser_screenshot(page, SHOTS / name / "first-screen.png")
    full = browser_screenshot(page, SHOTS / name / "full-page.png", height=min(m["scrollHeight"], 16000))
    print(f"screenshots of {page}: {first} {full}")
    return m


def test_fleet_of_64_hosts_fits_1280_px(work: Path) -> None:
    run_dir, report = samples.build("fleet64", work / "runs")
    write_reports(run_dir, report)
    m = check_in_browser(run_dir / "report.html", "fleet64", ["latency", "queue", "kv", "memory", "cache", "agent"])
    html = (run_dir / "report.html").read_text()
    # 64 nodes: the alike ones share one row; the three deviating nodes come first, each named.
    assert "61 nodes alike" in html
    groups = html[html.index('<table class="matrix">'):html.index("</table>", html.index('<table class="matrix">'))]
    order = [groups.index(n) for n in (samples.FLEET_R575, samples.FLEET_SEVEN, samples.FLEET_DOWN, "61 nodes alike")]
    assert order[-1] == max(order)
    assert "compat.driver_branch" in m["firstScreenText"] and samples.FLEET_DOWN in m["firstScreenText"]


@pytest.mark.lab
def test_lab_report_fits_1280_px_and_shows_the_record(lab_signoff_story: dict[str, Any]) -> None:
    run_b = lab_signoff_story["b"]
    m = check_in_browser(run_b / "report.html", "lab", ["latency", "queue", "kv", "memory", "cache", "agent"])
    first = m["firstScreenText"]
    assert "OVERRIDE of the verdict" in first and "Acceptance reopened" in first
    assert "context limit or concurrency" in first and "recipe record" in first
    assert "CPU lab" in first and "not provable" in first.lower()
