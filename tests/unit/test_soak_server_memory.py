"""The server's own memory in the soak (issue 42 item 4): process_resident_memory_bytes read from its /metrics
with every scrape, on the real vLLM /metrics captures of tests/fixtures/real/metrics (the lab server with one API
process exports it; with data parallel's several API servers, Prometheus multiprocess mode, there is none)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vllm_acceptance.core.evidence import EvidenceStore
from vllm_acceptance.core.findings import Status
from vllm_acceptance.probes.load import LoadProbeConfig, rules
from vllm_acceptance.probes.load.sampler import METRICS_RSS, Sampler, metrics_rss
from vllm_acceptance.probes.load.soak import host_memory
from vllm_acceptance.runtime.metrics import MetricsSource, Snapshot, parse_exposition

METRICS = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "metrics"
ONE_API_SERVER = METRICS / "vllm-0.32-cpu-lab.prom"


@pytest.mark.parametrize(("capture", "rss"), [
    ("vllm-0.32-cpu-lab.prom", 573861888),
    ("vllm-0.32-cpu-lab-disable-log-stats.prom", 571027456),
    ("vllm-0.32-cpu-lab-dp2.prom", None),                     # several API servers: no process_* series
    ("vllm-0.32-cpu-lab-dp4-hybrid-lb-idle.prom", None),
    ("vllm-0.7-router-v1-gpu-cache-usage.prom", None),        # process_start_time_seconds only
])
def test_metrics_rss_of_real_captures(capture: str, rss: int | None) -> None:
    assert metrics_rss(parse_exposition((METRICS / capture).read_text())) == rss


class Captures(MetricsSource):
    """A server whose /metrics answers one capture after another (the last one again once they run out)."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    def snapshot(self) -> Snapshot:
        return parse_exposition(self.texts.pop(0) if len(self.texts) > 1 else self.texts[0])


def with_rss(text: str, value: float) -> str:
    """The real capture with its process_resident_memory_bytes sample set to `value` (a leak's rise)."""
    out, n = re.subn(r"^process_resident_memory_bytes \S+$", f"process_resident_memory_bytes {value:.6e}", text,
                     flags=re.MULTILINE)
    assert n == 1
    return out


def soak_of(texts: list[str], tmp_path: Path) -> tuple[dict, Sampler]:
    """Scrape every capture as the sampler does over a soak (no local pid: a container or another node) and judge
    the soak on what it read."""
    sampler = Sampler(Captures(texts), EvidenceStore(tmp_path), LoadProbeConfig(model="m"))
    sampler.stage = "soak"
    for _ in range(len(texts)):
        sampler.take()
    host = host_memory(sampler.memory_series(0.0, 1e12))
    obs = {"requests": 40, "errors": 0, "timeouts": 0, "timed_out": [], **host, "restarts": [], "preemptions": 0.0,
           "start_times_seen": True, "log_observed": True, "comm_errors": []}
    return obs, sampler


def test_rss_rising_in_the_servers_own_metrics_fails_the_soak(tmp_path: Path) -> None:
    base = ONE_API_SERVER.read_text()
    texts = [with_rss(base, 573861888 + i * 40 * 2**20) for i in range(8)]     # +40 MiB a scrape
    obs, sampler = soak_of(texts, tmp_path)
    assert {m["series"] for m in sampler.memory} == {METRICS_RSS}
    assert (tmp_path / "memory.jsonl").read_text().count(METRICS_RSS) == 8
    assert obs["memory_source"] == METRICS_RSS and obs["memory_growth_pct"] > 20
    judged = rules.judge_soak(obs, 20.0, 0, evidence=[], configuration={}, request_timeout_s=60)
    assert judged.status == Status.FAIL and "(rss:/metrics)" in judged.reason


def test_flat_rss_in_the_servers_own_metrics_observes_the_memory(tmp_path: Path) -> None:
    obs, _ = soak_of([ONE_API_SERVER.read_text()] * 6, tmp_path)
    assert obs["memory_growth_pct"] == 0.0 and obs["memory_samples"] == 6
    judged = rules.judge_soak(obs, 20.0, 0, evidence=[], configuration={}, request_timeout_s=60)
    assert judged.status == Status.PASS


def test_several_api_servers_leave_the_memory_unobserved(tmp_path: Path) -> None:
    obs, sampler = soak_of([(METRICS / "vllm-0.32-cpu-lab-dp2.prom").read_text()] * 6, tmp_path)
    assert sampler.memory == [] and obs["memory_growth_pct"] is None
    judged = rules.judge_soak(obs, 20.0, 0, evidence=[], configuration={}, request_timeout_s=60)
    assert judged.status == Status.INCONCLUSIVE
    assert judged.observed["not_observed"] == [rules.MEMORY_UNSEEN]


def test_the_worst_host_series_decides() -> None:
    """A local pid's RSS flat, the RSS in /metrics rising (or the other way round): the rising one decides."""
    got = host_memory({"rss:vllm": [100] * 8, METRICS_RSS: [100, 110, 120, 130, 140, 150, 160, 170]})
    assert got["memory_source"] == METRICS_RSS and got["memory_growth_pct"] > 40
    assert got["memory_series"]["rss:vllm"] == {"growth_pct": 0.0, "samples": 8}
    assert host_memory({METRICS_RSS: [100, 100]})["memory_growth_pct"] is None
