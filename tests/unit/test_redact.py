"""Secrets never reach evidence; counters that merely contain 'token' are kept."""

from __future__ import annotations

import json

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


def test_a_secret_flag_value_shaped_like_a_placeholder_is_still_redacted() -> None:
    """Hypothesis found `<000>` and a backtick: after --api-key a value is a secret, whatever it looks like; a
    placeholder in a message (`token=<your_token>`) stays readable."""
    for secret in ("<000>`", "<sk-live-123>", "<abcdef>"):
        assert secret not in redact_text(f"vllm serve m --api-key {secret} --port 8000").replace(REDACTED, "")
    assert "token=<your_token>" in redact_text("set token=<your_token> in the environment")


def test_url_credentials_go_the_host_and_path_stay() -> None:
    """Issue 30 item 5: user:password@ and token@ inside URLs, whatever variable or line holds them."""
    text = ("HTTPS_PROXY=http://proxyuser:pr0xyPass@proxy.corp:3128\n"
            "DATABASE_URL=postgres://dbuser:dbPa55@db.internal:5432/acc\n"
            "git clone https://ghp_tokenABC123@github.com/org/repo.git\n"
            '{"remote": "https://oauth2:glpat-XYZ987@gitlab.example/group/p.git"}')
    out = redact_text(text)
    for secret in ("proxyuser", "pr0xyPass", "dbuser", "dbPa55", "ghp_tokenABC123", "oauth2", "glpat-XYZ987"):
        assert secret not in out
    for readable in (f"http://{REDACTED}@proxy.corp:3128", f"postgres://{REDACTED}@db.internal:5432/acc",
                     f"https://{REDACTED}@github.com/org/repo.git", "gitlab.example/group/p.git"):
        assert readable in out
    # URLs without credentials, and '@' after the host, are left as they are
    plain = "http://127.0.0.1:8011/v1 https://huggingface.co/moonshotai/Kimi-K3?x=a@b mailto:ops@example.org"
    assert redact_text(plain) == plain


def test_secret_bearing_names_and_counters() -> None:
    env = {"AWS_SECRET_ACCESS_KEY": "aws-s3cr3t", "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "HUGGING_FACE_HUB_TOKEN": "hf_1",
           "GITHUB_TOKEN_RO": "gh_1", "NCCL_AUTH": "au_1", "DB_PASSWD": "pw_1", "SMTP_PASS": "pw_2",
           "GOOGLE_APPLICATION_CREDENTIALS_JSON": "{cred}", "MY_PRIVATE_KEY": "pk_1", "OPENAI_APIKEY": "sk_1",
           "session_cookie": "ck_1", "clientSecret": "cs_1", "accessToken": "at_1"}
    dump = "\n".join(f"{k}={v}" for k, v in env.items())
    out = redact_text(dump)
    kept = {"AWS_ACCESS_KEY_ID"}  # an access key id names the key, it is not the secret half
    for name, value in env.items():
        assert (value in out) == (name in kept), name
    assert redact_obj(env) == {k: (v if k in kept else REDACTED) for k, v in env.items()}
    counters = ("max_num_batched_tokens=8192 prompt_tokens=10 TOKENIZERS_PARALLELISM=false PWD=/root "
                "HF_TOKEN_PATH=/root/.cache/huggingface/token image_token_id=32001 --tokenizer-mode auto "
                "--max-num-batched-tokens 8192 first_token=0.25")
    assert redact_text(counters) == counters


def test_secret_flags_in_argv_lists_and_json_text() -> None:
    argv = ["vllm", "serve", "m", "--hf-token", "hf_argv1", "--api-key=sk-argv2", "--port", "8000",
            "-e", "HF_TOKEN=hf_argv3", "--enable-auth", "--max-num-seqs", "4"]
    out = redact_obj(argv)
    assert out == ["vllm", "serve", "m", "--hf-token", REDACTED, f"--api-key={REDACTED}", "--port", "8000",
                   "-e", f"HF_TOKEN={REDACTED}", "--enable-auth", "--max-num-seqs", "4"]
    text = json.dumps(argv, indent=2)
    assert "hf_argv1" not in redact_text(text) and '"8000"' in redact_text(text)
    shell = "docker run -e HF_TOKEN --env-file x img --api-key 'sk quoted' --x-auth-token=\"tk 2\""
    assert "sk quoted" not in redact_text(shell) and "tk 2" not in redact_text(shell)
    headers = "X-Api-Key: xk_1\nAuthorization: Bearer bt_1\nkey: routing-7"
    out_h = redact_text(headers)
    assert "xk_1" not in out_h and "bt_1" not in out_h and f"Bearer {REDACTED}" in out_h and "routing-7" in out_h


def test_names_that_merely_end_in_key_are_kept() -> None:
    """A report's threshold {"key": ...}, an idempotency key, sort_keys: names, not secrets (they reach reports)."""
    data = {"key": "ttft_p95_slo_s", "idempotency_key": "ord-1", "sort_keys": "true", "cache_key": "abc",
            "api_key": "sk-1", "OPENAI_KEY": "sk-2", "X-Api-Key": "sk-3"}
    assert redact_obj(data) == {**data, "api_key": REDACTED, "OPENAI_KEY": REDACTED, "X-Api-Key": REDACTED}


def test_vllm_non_default_args_as_python_dict() -> None:
    line = ("INFO non-default args: {'model': '/m', 'hf_token': 'hf_pyrepr1', 'api_key': ['sk-pyrepr2'], "
            "'max_num_batched_tokens': 8192, 'tokenizer_mode': 'auto'}")
    out = redact_text(line)
    assert "hf_pyrepr1" not in out and "sk-pyrepr2" not in out
    assert "'model': '/m'" in out and "'max_num_batched_tokens': 8192" in out and "'tokenizer_mode': 'auto'" in out
