"""The P/D path checks on a real CPU pair (docs/lab.md; tests/fixtures/pd_path/README.md): a prefill
(`kv_producer`) and a decode (`kv_consumer`) vLLM 0.32 joined by the ExampleConnector on one shared path, with the
lab's stand-in router (tests/support/pd_router.py) as the entry point.

- healthy: the three counter checks pass, and a stopped prefill makes every request through the entry point fail
  with HTTP 502 while the decode survives (quality.pd_prefill_stopped passes through the real stop/start commands);
- the decode on another storage path (the connector misconfigured): it finds no KV and recomputes every prompt --
  vLLM answers HTTP 200 with text, whatever kv_load_failure_policy says (the ExampleConnector reports no match, so
  no load fails) -- and quality.pd_decode_loaded fails.

A slower variant (`full`): the default suite decides the same checks on the lab P/D deployment with the real NIXL
connector and vllm-router (tests/integration/test_pd_lab.py); this one keeps the ExampleConnector pair.

Ports: LAB_TEST_PORT_PD (default 8620; prefill there, decode +1, router +10) plus LAB_PORT_OFFSET.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import LAB_PROFILE, LAB_PYTHON, REPO, LabServer, lab_skip_reason, start_lab, stop_lab

from vllm_acceptance.core.evidence import EvidenceStore
from vllm_acceptance.core.findings import Status
from vllm_acceptance.probes.options import ProbeOptions
from vllm_acceptance.probes.quality import pd_path

from support.pd_lab import PROMPTS, kv_config, send_prompts
from support.pd_router import PdRouter

pytestmark = [pytest.mark.lab, pytest.mark.full]


@dataclass
class Pair:
    prefill: LabServer
    decode: LabServer
    router: PdRouter
    kv_dir: Path
    prefill_args: str

    def opts(self, out: Path, **overrides: object) -> ProbeOptions:
        up = [sys.executable, "-m", "vllm_acceptance.cli", "lab", "up", "--state-dir", str(self.prefill.state_dir),
              "--port", self.prefill.base_url.rsplit(":", 1)[1].split("/")[0], "--python", str(LAB_PYTHON),
              "--profile", str(LAB_PROFILE), f"--extra-args={self.prefill_args}"]
        down = [sys.executable, "-m", "vllm_acceptance.cli", "lab", "down", "--state-dir", str(self.prefill.state_dir)]
        env = f"cd {shlex.quote(str(REPO))} && PYTHONPATH={shlex.quote(os.environ.get('PYTHONPATH', ''))} "
        return ProbeOptions(kind="quality", base_url=self.router.base_url, model="tiny-agent", out_dir=out,
                            overrides=dict(overrides),
                            pools={"prefill": [{"base_url": self.prefill.base_url,
                                                "stop_command": env + shlex.join(down),
                                                "start_command": env + shlex.join(up)}],
                                   "decode": [{"base_url": self.decode.base_url}]})


def start_decode(state: Path, port: int, kv_dir: Path) -> LabServer:
    return start_lab(state, port=port, extra_args=kv_config("kv_consumer", str(kv_dir)))


@pytest.fixture(scope="module")
def pd_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    reason = lab_skip_reason()
    if reason:
        pytest.skip(reason)
    port = int(os.environ.get("LAB_TEST_PORT_PD", "8620")) + int(os.environ.get("LAB_PORT_OFFSET", "0"))
    kv_dir = tmp_path_factory.mktemp("pd-kv")
    prefill_args = kv_config("kv_producer", str(kv_dir))
    prefill = start_lab(tmp_path_factory.mktemp("pd-prefill"), port=port, extra_args=prefill_args)
    decode = None
    try:
        decode = start_decode(tmp_path_factory.mktemp("pd-decode"), port + 1, kv_dir)
        with PdRouter(prefill.base_url, decode.base_url, port + 10) as router:
            pair = Pair(prefill, decode, router, kv_dir, prefill_args)
            yield pair
            decode = pair.decode
    finally:
        if decode is not None:
            stop_lab(decode)
        stop_lab(prefill)


def judged(pair: Pair, out: Path, **overrides: object) -> dict[str, object]:
    opts = pair.opts(out, **overrides)
    store = EvidenceStore(out)
    check = pd_path.CHECK
    assert check.applies(opts)
    before = check.before(opts, store)
    answers = send_prompts(pair.router.base_url)
    assert all(a["status"] == 200 for a in answers), answers
    return {f.check: f for f in check.after(opts, before, {"requests_sent": len(PROMPTS)}, store)}


def test_a_healthy_pair_passes_and_a_stopped_prefill_fails_loudly(pd_pair: Pair, tmp_path: Path) -> None:
    findings = judged(pd_pair, tmp_path)   # quality.pd_stop_prefill unset: the pool has the commands, so it runs
    for check in ("quality.pd_prefill_served", "quality.pd_decode_loaded", "quality.pd_transfer_failures"):
        assert findings[check].status == Status.PASS, findings[check]
    stopped = findings["quality.pd_prefill_stopped"]
    assert stopped.status == Status.PASS, stopped
    assert [r["status"] for r in stopped.observed["during"]] == [502] * 3
    assert stopped.observed["after"]["outcome"] == "text"


def test_a_decode_on_another_storage_path_recomputes_and_fails(pd_pair: Pair, tmp_path: Path) -> None:
    stop_lab(pd_pair.decode)
    port = int(pd_pair.decode.base_url.rsplit(":", 1)[1].split("/")[0])
    pd_pair.decode = start_decode(pd_pair.decode.state_dir, port, tmp_path / "another-kv")
    pd_pair.router.decode = pd_pair.decode.base_url.rstrip("/")
    findings = judged(pd_pair, tmp_path / "run", **{"quality.pd_stop_prefill": False})
    loaded = findings["quality.pd_decode_loaded"]
    assert loaded.status == Status.FAIL, loaded
    assert "computed" in loaded.reason
    assert findings["quality.pd_prefill_served"].status == Status.PASS   # the prefill did its part
    assert findings["quality.pd_prefill_stopped"].status == Status.NOT_APPLICABLE
