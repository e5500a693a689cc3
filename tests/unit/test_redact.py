"""Secrets never reach evidence; counters that merely contain 'token' are kept."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from vllm_acceptance.core.redact import REDACTED, redact_obj, redact_text


def test_env_and_flags_and_headers() -> None:
    text = ("HF_TOKEN=hf_live_1234 OPENAI_API_KEY=sk-abcdef --api-key sk-zzzzzz "
            "Authorization: Bearer sk-yyyyyy DB_PASSWORD=hunter22 max_num_batched_tokens=8192")
    out = redact_text(text)
    for secret in ("hf_live_1234", "sk-abcdef", "sk-zzzzzz", "sk-yyyyyy", "hunter22"):
        assert secret not in out
    assert "max_num_batched_tokens=8192" in out


def test_known_secret_values_are_removed_anywhere() -> None:
    assert "s3cr3t-value" not in redact_text("url?key=s3cr3t-value&x=1", ["s3cr3t-value"])


def test_json_structures_keep_usage_counts() -> None:
    data = {"usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
            "env": {"HF_TOKEN": "hf_x1234", "PATH": "/usr/bin"}, "api_key": "sk-1234"}
    out = redact_obj(data)
    assert out["usage"] == data["usage"]
    assert out["env"]["HF_TOKEN"] == REDACTED and out["env"]["PATH"] == "/usr/bin"
    assert out["api_key"] == REDACTED


@given(st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="'\" ,"),
               min_size=6, max_size=40))
def test_any_api_key_flag_value_is_redacted(secret: str) -> None:
    assert secret not in redact_text(f"vllm serve m --api-key {secret} --port 8000").replace(REDACTED, "")
