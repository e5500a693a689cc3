"""Another model behind the served name (issue 42, item 1; docs/checks.md, compat.served_model), on the real lab
vLLM in attach mode, judged by the serve stage itself (serve/stage.py judge_serve: /v1/models, /metrics, the
operator's startup log).

Cheap: no server of its own. The session's K3 lab server (conftest k3_lab_server, profiles/cpu-lab-k3.yml) serves
the weights of .lab/models/tiny-agent-k3 under the name `tiny-agent`, the name the lab's hermes model is served
under. A site profile that accepts the lab's `tiny-agent` weights with the K3 launch flags sees every flag, parser
and the name as it asked; only the weights differ, and only compat.served_model says so. The session's lab server
(conftest lab_server) serving its own model under the cpu-lab profile is the healthy side.

Not covered here: a lab server started with `--quantization fp8` (vLLM's CPU build has no fp8 weight quantization
for this model, so it would not come up); the unit tests hold that case to vLLM 0.32's own non-default args line
(tests/unit/test_served_model.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from conftest import LAB_PROFILE, LAB_PROFILE_K3, REPO

from vllm_acceptance.core.findings import Status
from vllm_acceptance.core.profile import Profile, load_profile
from vllm_acceptance.serve.stage import ServeFacts, judge_serve
from vllm_acceptance.verdict import decide

pytestmark = pytest.mark.lab


def attached(tmp_path: Path, server, profile: Profile) -> dict:
    argv = [a.decode() for a in Path(f"/proc/{server.pid}/cmdline").read_bytes().split(b"\0") if a]
    facts = ServeFacts(base_url=server.base_url, host="localhost", mode="attach", metrics_url=server.metrics_url,
                       startup_log=server.log_path.read_text(), startup_log_source=f"the file {server.log_path}",
                       process_args=argv)   # as the serve role reads it from vllm_serve_pid (the log is tied to it)
    return {f.check: f for f in judge_serve(tmp_path, profile, facts)}


def k3_flags_with_the_hermes_weights() -> Profile:
    """cpu-lab-k3's launch (flags, parsers, served name `tiny-agent`), but the model it accepts is the lab's
    hermes model .lab/models/tiny-agent."""
    data = json.loads(json.dumps(load_profile(LAB_PROFILE_K3).data))
    data["name"] = "cpu-lab-k3-site"
    data["model"].update(name="tiny-agent", path=".lab/models/tiny-agent")
    return Profile(data=data, source="a site profile accepting the hermes weights with the K3 launch")


def test_another_model_behind_the_served_name_fails_and_never_releases(k3_lab_server, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    findings = attached(tmp_path, k3_lab_server, k3_flags_with_the_hermes_weights())
    assert findings["compat.startup_log_identity"].status == Status.PASS         # the log is this server's
    for check in ("compat.actual_config.flags", "compat.actual_config.unlisted_args"):
        assert findings[check].status == Status.PASS, (check, findings[check].reason)   # nothing else sees it
    served = findings["compat.served_model"]
    assert served.status == Status.FAIL, served.reason
    assert "'tiny-agent' serves root '.lab/models/tiny-agent-k3'" in served.reason
    assert "'.lab/models/tiny-agent'" in served.reason
    assert served.observed["v1_models"][0]["id"] == "tiny-agent"
    assert decide(list(findings.values())).verdict != "release"
    assert (tmp_path / "evidence" / "serve" / "v1-models.json").is_file()


def test_the_lab_serving_its_own_model_passes_with_its_config_hash(lab_server, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    served = attached(tmp_path, lab_server, load_profile(LAB_PROFILE))["compat.served_model"]
    assert served.status == Status.PASS, served.reason
    config = REPO / ".lab" / "models" / "tiny-agent" / "config.json"
    assert served.observed["checkpoint_config"]["sha256"] == hashlib.sha256(config.read_bytes()).hexdigest()
