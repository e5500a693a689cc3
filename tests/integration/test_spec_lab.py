"""Speculative decoding judged on the real lab vLLM (issue 45 items 4 and 5; docs/checks.md quality.spec_acceptance,
quality.spec_throughput): the n-gram speculator of profiles/cpu-lab-spec.yml passes the acceptance floor, a draft
model that disagrees with the served weights (lab/spec_draft.py) fails it. The session's plain lab server is the
reference without speculative decoding; each speculative server is started for its test and stopped after it (one
extra server at a time). The path check runs as the quality probe runs it (before, then after with no parity pass:
it sends its own seeded requests)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import LAB_MODEL, LAB_PYTHON, REPO

from vllm_acceptance.core.evidence import EvidenceStore
from vllm_acceptance.core.findings import Finding, Status
from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.probes.options import ProbeOptions
from vllm_acceptance.probes.quality.spec_decode import CHECK

pytestmark = pytest.mark.lab

SPEC_PROFILE = REPO / "profiles" / "cpu-lab-spec.yml"
PORT_SPEC = 8047


def judged(server: Any, reference: Any, run: Path, profile: Path, throughput_requests: int = 8
           ) -> tuple[bool, list[Finding]]:
    """The served argv recorded as the serve stage records it (the process's /proc/PID/cmdline), then the path
    check around an empty parity pass."""
    served = run / "evidence" / "serve" / "process-args.json"
    served.parent.mkdir(parents=True, exist_ok=True)
    argv = Path(f"/proc/{server.pid}/cmdline").read_bytes().decode().split("\0")
    served.write_text(json.dumps([a for a in argv if a]))
    out = run / "probes" / "quality"
    opts = ProbeOptions(kind="quality", base_url=server.base_url, model=server.model, out_dir=out,
                        profile=load_profile(profile), metrics_url=server.metrics_url,
                        reference_url=reference.base_url,
                        overrides={"quality.spec_decode.throughput_requests": throughput_requests})
    store = EvidenceStore(run, "probes/quality")
    applies = CHECK.applies(opts)
    before = CHECK.before(opts, store)
    return applies, CHECK.after(opts, before, None, store)


def test_healthy_ngram_passes_the_acceptance_floor(lab_server: Any, lab_server_factory: Any, tmp_path: Path) -> None:
    server = lab_server_factory("", PORT_SPEC, profile=SPEC_PROFILE)
    applies, (acceptance, throughput) = judged(server, lab_server, tmp_path / "run", SPEC_PROFILE)
    assert applies
    assert acceptance.status == Status.PASS, acceptance.reason
    assert acceptance.observed["drafts"] >= 30 and acceptance.observed["mean_acceptance_length"] >= 2.0
    # both sides measured in full at the contract's concurrency, the ratio stated (its value is the machine's)
    assert throughput.status != Status.NOT_APPLICABLE and "ratio" in (throughput.observed or {}), throughput.reason


def test_a_draft_model_that_disagrees_fails_the_acceptance_floor(lab_server: Any, lab_server_factory: Any,
                                                                 tmp_path: Path) -> None:
    draft = tmp_path / "draft"
    subprocess.run([str(LAB_PYTHON), "-m", "vllm_acceptance.lab.spec_draft", "--source", str(LAB_MODEL),
                    "--out", str(draft)], check=True, cwd=REPO, timeout=300,
                   env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    config = json.dumps({"method": "draft_model", "model": str(draft), "num_speculative_tokens": 3},
                        separators=(",", ":"))
    # the plain cpu-lab profile: the speculative config is read from the running server's argv
    server = lab_server_factory(f"--speculative-config={config}", PORT_SPEC + 1)
    # throughput not measured here (0 requests: not_applicable): the acceptance is what this test decides
    applies, (acceptance, throughput) = judged(server, lab_server, tmp_path / "run", REPO / "profiles" / "cpu-lab.yml",
                                               throughput_requests=0)
    assert applies
    assert acceptance.status == Status.FAIL, acceptance.reason
    assert acceptance.observed["mean_acceptance_length"] < 1.5 and "mean acceptance length" in acceptance.reason
    assert throughput.status == Status.NOT_APPLICABLE
