"""Secret redaction: API keys and tokens never reach evidence, logs or reports."""

from __future__ import annotations

import re
from typing import Any

REDACTED = "***REDACTED***"

# Names whose values are secrets: they END in the secret word (HF_TOKEN, OPENAI_API_KEY, db_password),
# so counters such as `prompt_tokens` or `max_num_batched_tokens` are left alone.
_SECRET_WORD = r"(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIALS?|AUTHORIZATION|APIKEY)"
SECRET_NAME = re.compile(rf"(?:^|[_\-.]){_SECRET_WORD}$|^{_SECRET_WORD}$|SECRET|PASSWORD", re.IGNORECASE)
_PATTERNS = [
    # NAME=value (env dumps, docker -e, shell lines)
    re.compile(rf"(?P<k>\b[A-Za-z0-9_]*{_SECRET_WORD})(?P<sep>=)(?P<v>[^\s'\",]+)", re.IGNORECASE),
    # --api-key value / --api-key=value / --hf-token value
    re.compile(r"(?P<k>--(?:api-key|hf-token|token|password))(?P<sep>[ =])(?P<v>[^\s'\"]+)", re.IGNORECASE),
    # Authorization: Bearer xyz
    re.compile(r"(?P<k>[Aa]uthorization)(?P<sep>[\"']?\s*[:=]\s*[\"']?)(?P<v>(?:Bearer|Basic)\s+[^\s'\"]+)"),
    # JSON "api_key": "value"
    re.compile(rf"(?P<k>\"[A-Za-z0-9_]*{_SECRET_WORD}\")(?P<sep>\s*:\s*)(?P<v>\"[^\"]*\")", re.IGNORECASE),
]


def redact_text(text: str, extra_secrets: list[str] | None = None) -> str:
    """Replace secret values in free text; `extra_secrets` are literal values known to be secret."""
    for secret in extra_secrets or []:
        if secret and len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: f"{m.group('k')}{m.group('sep')}{_mask(m.group('v'))}", text)
    return text


def _mask(value: str) -> str:
    if value.startswith('"'):
        return f'"{REDACTED}"'
    if value.lower().startswith(("bearer ", "basic ")):
        return value.split()[0] + " " + REDACTED
    if "KEY_USAGE" in value or value in ("", "none", "null"):
        return value
    return REDACTED


def redact_obj(obj: Any, extra_secrets: list[str] | None = None) -> Any:
    """Redact a JSON-like structure: secret-named keys lose their values, strings are scanned."""
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            if isinstance(key, str) and SECRET_NAME.search(key) and isinstance(value, str):
                out[key] = REDACTED
            else:
                out[key] = redact_obj(value, extra_secrets)
        return out
    if isinstance(obj, list):
        return [redact_obj(v, extra_secrets) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj, extra_secrets)
    return obj
