"""Prometheus as users run it (issue 28 item 7): a real Prometheus (Debian package) scraping two real lab
vLLM servers every 15 s. The probes' metrics source names the server under test (its instance, by default),
reads the real scrape interval from /api/v1/targets, waits for a scrape made after each reading began, and
never sums the two servers. One cache-probe-like measurement (counters before and after one request), not
a run."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import pytest

from vllm_acceptance.runtime.metrics import DirectMetrics, MetricsError, PrometheusMetrics, delta, metrics_source

from support.prom import Prometheus

pytestmark = pytest.mark.lab


def hostport(base_url: str) -> str:
    return base_url[len("http://"):-len("/v1")]


def test_prometheus_at_15s_reads_the_server_under_test_alone_after_its_scrape(
        lab_server, lab_pressure_server, tmp_path: Path) -> None:
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus not installed: apt-get install prometheus (make test does)")
    prom = Prometheus(tmp_path / "prom", [hostport(lab_server.base_url), hostport(lab_pressure_server.base_url)],
                      interval_s=15.0)
    try:
        deadline = time.time() + 60   # the first scrape of each target: within one 15 s interval
        while time.time() < deadline:
            up = httpx.get(f"{prom.url}/api/v1/query", params={"query": "up == 1"}, timeout=5).json()
            if len(up["data"]["result"]) == 2:
                break
            time.sleep(0.5)
        # Both servers expose the same vllm families: a job-wide query is refused, never summed.
        with pytest.raises(MetricsError, match="2 scrape targets"):
            PrometheusMetrics(prom.url, selector='job="vllm"').snapshot()

        source = metrics_source(None, prom.url, None, lab_server.base_url)   # default: the run's own instance
        assert isinstance(source, PrometheusMetrics)
        assert source.scrape_interval_s() == 15.0
        source.wait_for_scrape()
        before = source.snapshot()
        direct = DirectMetrics(lab_server.metrics_url).snapshot()
        assert before.value("vllm:prompt_tokens") == direct.value("vllm:prompt_tokens")   # not the pair's sum
        answer = httpx.post(f"{lab_server.base_url}/chat/completions", timeout=120, json={
            "model": lab_server.model, "max_tokens": 4, "temperature": 0.0,
            "messages": [{"role": "user", "content": "Prometheus scrapes every 15 s; name one server."}]})
        assert answer.status_code == 200, answer.text
        prompt_tokens = answer.json()["usage"]["prompt_tokens"]
        source.wait_for_scrape()   # a quiet window sized to the real interval, ended by the scrape itself
        after = source.snapshot()
        assert delta(before, after, "vllm:prompt_tokens") == prompt_tokens
        assert delta(before, after, "vllm:request_success") == 1
    finally:
        prom.stop()
