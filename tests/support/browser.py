"""Headless Debian chromium for the report tests: measure a page at a width, and screenshot it.

The report itself carries no script (self-contained, air-gap safe). To measure it, a copy gets one
inline script that writes what the browser laid out (scroll width, sections, each plot's drawn size)
into the DOM, and chromium's --dump-dom prints that DOM after load. Screenshots are taken of the
unmodified report.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
         "--hide-scrollbars", "--disable-quic"]

MEASURE = """<script>
window.addEventListener('load', function () {
  var d = document.documentElement, w = window.innerWidth;
  var wide = [].filter.call(document.querySelectorAll('body *'), function (e) {
    var b = e.getBoundingClientRect(); return b.width > 0 && b.right > w + 0.5; });
  var r = {scrollWidth: d.scrollWidth, innerWidth: w, scrollHeight: d.scrollHeight,
    sections: [].map.call(document.querySelectorAll('section[id]'), function (s) { return s.id; }),
    plots: [].map.call(document.querySelectorAll('figure[data-plot]'), function (f) {
      var s = f.querySelector('svg'), b = s ? s.getBoundingClientRect() : {width: 0, height: 0};
      return {name: f.dataset.plot, width: Math.round(b.width), height: Math.round(b.height),
              paths: s ? s.querySelectorAll('path').length : 0, texts: s ? s.querySelectorAll('text').length : 0}; }),
    overflowing: wide.slice(0, 12).map(function (e) {
      return e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + '.' + String(e.className).split(' ')[0] + ' right='
        + Math.round(e.getBoundingClientRect().right); }),
    firstScreenText: (document.getElementById('first-screen') || {innerText: ''}).innerText};
  var pre = document.createElement('pre'); pre.id = 'vllm-acceptance-measure';
  pre.textContent = JSON.stringify(r); document.body.appendChild(pre);
});
</script>"""


def _run(args: list[str], profile: Path, timeout: int = 180) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM, "Debian chromium is not installed (apt-get install -y chromium)"
    cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def measure(page: Path, work: Path, width: int = 1280, height: int = 900) -> dict[str, Any]:
    """Layout facts of `page` at `width` px: scrollWidth, innerWidth, section ids, plots drawn."""
    work.mkdir(parents=True, exist_ok=True)
    probe = work / f"{page.parent.name}-{page.stem}.measure.html"
    probe.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    # The copy sits in the same directory as the report so relative links resolve alike.
    target = page.parent / probe.name
    shutil.copy(probe, target)
    try:
        proc = _run([f"--window-size={width},{height}", "--dump-dom", target.resolve().as_uri()], work / "profile-m")
    finally:
        target.unlink()
        shutil.rmtree(work / "profile-m", ignore_errors=True)
    found = re.search(r'<pre id="vllm-acceptance-measure">(.*?)</pre>', proc.stdout, re.S)
    assert found, f"chromium printed no measurement (rc {proc.returncode}): {proc.stderr[-1500:]}"
    text = found.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&amp;", "&")
    return json.loads(text)


def screenshot(page: Path, png: Path, width: int = 1280, height: int = 900) -> Path:
    png.parent.mkdir(parents=True, exist_ok=True)
    proc = _run([f"--window-size={width},{height}", f"--screenshot={png}", page.resolve().as_uri()],
                png.parent / f"profile-{png.stem}")
    assert png.is_file(), f"chromium wrote no screenshot (rc {proc.returncode}): {proc.stderr[-1500:]}"
    shutil.rmtree(png.parent / f"profile-{png.stem}", ignore_errors=True)
    return png
