"""recheck.html in a real browser (Debian chromium, headless): it renders at 1280 px without overflowing, holds its
sections, shows the verdict's banner colour (report.css, the acceptance report's family) and its exit code.

The re-check is a real judgement (recheck/judge.py) of a pair generated from the recorded lab run
(tests/support/recheck_pairs.py): today's agent tool-call rate leaves its interval and a flag was added.
The screenshot is kept under reports/screenshots/ (REPORT_SCREENSHOTS_DIR moves it) for a human look.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from vllm_acceptance.core.rundir import RunDir
from vllm_acceptance.recheck.judge import judge
from vllm_acceptance.recheck.report import write_recheck

from support.browser import CHROMIUM, measure, screenshot
from support.recheck_pairs import args_of, finding, pair

pytestmark = pytest.mark.chromium
if CHROMIUM is None:
    pytest.skip("Debian chromium is not installed (apt-get install -y chromium)", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("REPORT_SCREENSHOTS_DIR") or REPO / "reports" / "screenshots")
DRIFTED_RGB = (0xB3, 0x59, 0x00)     # .v-limited_observation: a drifted re-check's banner


def test_recheck_html_renders_and_fits(tmp_path: Path) -> None:
    def drifted(report: dict[str, Any]) -> None:
        finding(report, "agent.tool_call")["observed"]["rate"].update(events=31, n=299, value=31 / 299)
        args_of(report).update(enable_log_requests=True)

    base_dir, today_dir = pair(tmp_path, drifted, rates=True)
    write_recheck(base_dir, today_dir, judge(base_dir, today_dir))
    page = RunDir(today_dir).report_file("recheck.html")
    laid = measure(page, tmp_path / "measure", width=1280)
    assert laid["scrollWidth"] <= laid["innerWidth"], laid["overflowing"]
    assert laid["sections"] == ["verdict", "first-screen", "drifts", "rates", "lineage"]
    assert "signed decision no longer holds" in laid["firstScreenText"]
    png = screenshot(page, tmp_path / "recheck.png", width=1400, height=1600)
    from PIL import Image  # Pillow comes with matplotlib

    with Image.open(png) as img:
        counted = img.convert("RGB").getcolors(maxcolors=img.width * img.height) or []
    solid = {tuple(c) for n, c in counted if n >= 200}
    assert len(counted) > 200 and any(all(abs(a - b) <= 3 for a, b in zip(px, DRIFTED_RGB, strict=True))
                                      for px in solid)
    SHOTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(png, SHOTS / "recheck-drifted.png")
    print(f"screenshot: {SHOTS / 'recheck-drifted.png'}")
