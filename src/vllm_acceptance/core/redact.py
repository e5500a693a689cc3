"""Secret redaction: API keys, tokens, passwords and URL credentials never reach evidence, logs or reports.

What counts as a secret (docs/acceptance.md "Contracts": secrets never reach evidence or reports):
- the value of a variable, flag or JSON field whose name is secret-bearing (SECRET_NAME): one of its
  parts (split on `_`, `-`, `.`) is TOKEN, SECRET, PASSWORD, PASSWD, PASS, APIKEY, CREDENTIAL(S), AUTH,
  AUTHORIZATION, COOKIE, or it ends in KEY as an environment name (OPENAI_API_KEY, AWS_SECRET_ACCESS_KEY) or
  after a qualifier (api_key, private-key, accessKey; not `key`, `sort_keys`, `idempotency_key`);
  counters such as `prompt_tokens` or `max_num_batched_tokens` are left alone (TOKENS is not TOKEN);
- the user information of a URL (`scheme://user:password@host`, `https://token@github.com/...`): the
  whole `user:password` part is replaced, the scheme, host, port and path stay readable;
- an `Authorization: Bearer|Basic ...` header value, and literal values known to be secret (extra_secrets).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

REDACTED = "***REDACTED***"

# Parts of a name that make its value a secret (HF_TOKEN, DB_PASSWORD, NCCL_AUTH_TOKEN, GITHUB_TOKEN_RO).
_SECRET_PARTS = frozenset({"TOKEN", "SECRET", "SECRETS", "PASSWORD", "PASSWORDS", "PASSWD", "PASS", "PWD",
                           "APIKEY", "CREDENTIAL", "CREDENTIALS", "AUTH", "AUTHORIZATION", "COOKIE", "PASSPHRASE"})
# Names built on these parts that are not secrets: the shell's working directory, a path to a token file
# is still redacted (harmless), but these carry no secret at all.
_NOT_SECRET = frozenset({"PWD", "OLDPWD", "PASS", "AUTH_TYPE", "AUTH_MODE", "AUTH_METHOD", "AUTH_ENABLED",
                         "FIRST_TOKEN", "LAST_TOKEN", "NEXT_TOKEN"})
# A last part that makes the name a count, an id, a time or a location, not a secret (image_token_id, TOKEN_LIMIT,
# HF_TOKEN_PATH: the file holds the secret, its path does not).
_NOT_SECRET_LAST = frozenset({"ID", "IDS", "INDEX", "COUNT", "COUNTS", "LEN", "LENGTH", "LIMIT", "BUDGET", "RATE",
                              "S", "MS", "SECONDS", "TIME", "TIMEOUT", "PATH", "FILE", "TYPE", "MODE", "ENABLED"})
# What makes a lower-case `*_key` a secret key (api_key, secret_key, private_key, ...).
_KEY_QUALIFIERS = frozenset({"API", "SECRET", "ACCESS", "PRIVATE", "SIGNING", "ENCRYPTION", "MASTER", "AUTH", "SESSION",
                             "CLIENT", "SSH", "LICENSE", "ACCOUNT", "SERVICE", "STORAGE", "HMAC", "JWT", "SHARED",
                             "WEBHOOK", "DEPLOY", "GPG", "PGP", "CRYPTO", "PRIV"})
_SPLIT = re.compile(r"[_\-.\s]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


@lru_cache(maxsize=4096)
def is_secret_name(name: str) -> bool:
    """True when a variable, flag or field name carries a secret value (module docstring)."""
    bare = name.strip().strip("\"'").lstrip("-")
    upper = _CAMEL.sub("_", bare).upper()
    parts = [p for p in _SPLIT.split(upper) if p]
    if not parts or upper.replace("-", "_") in _NOT_SECRET:
        return False
    if parts[-1] in ("KEY", "KEYS"):
        # OPENAI_API_KEY, AZURE_OPENAI_KEY (an environment name), api_key, accessKey: secrets; key, sort_keys,
        # idempotency_key, a threshold's "key": names, not secrets
        return len(parts) > 1 and (bare.replace("-", "_").isupper() or parts[-2] in _KEY_QUALIFIERS)
    if upper.endswith(("APIKEY", "PASSWORD", "SECRET", "TOKEN")):
        return True
    if parts[-1] in _NOT_SECRET_LAST:
        return False
    return bool(_SECRET_PARTS.intersection(parts)) or "PASSWORD" in upper or "SECRET" in upper


class _SecretName:
    """Kept for callers that used the former regular expression: SECRET_NAME.search(name)."""

    @staticmethod
    def search(name: str) -> bool:
        return is_secret_name(name)


SECRET_NAME = _SecretName()

# scheme://user[:password]@host : the user information, up to the last '@' before the host's '/', '?' or '#'.
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^\s/?#@'\"<>\[\]{}|\\^`]+)@")
# NAME=value (env dumps, docker -e, shell lines, query strings); the name is judged by is_secret_name.
_ASSIGN = re.compile(r"(?P<k>(?<![A-Za-z0-9_.\-])[A-Za-z_][A-Za-z0-9_.\-]*)(?P<sep>=)(?P<v>[^\s'\",&;]+)")
# --api-key value / --api-key=value / --hf-token value: these flags take any value, even one that starts with '-'
_VALUE = r"(?:'[^'\n]*'|\"[^\"\n]*\"|[^\s'\"]+)"
_KNOWN_FLAG = re.compile(rf"(?P<k>--(?:api-key|hf-token|token|password))(?P<sep>[ =])(?P<v>{_VALUE})", re.IGNORECASE)
# --any-secret-name value (not a following flag)
_FLAG = re.compile(rf"(?P<k>(?<![A-Za-z0-9])--[A-Za-z][A-Za-z0-9\-]*)(?P<sep>[ =])(?P<v>(?!-){_VALUE})")
# a Python dict as vLLM logs it ("non-default args: {'hf_token': 'hf_...', 'api_key': ['sk-...']}")
_PY_FIELD = re.compile(r"(?P<k>'[A-Za-z0-9_.\-]+')(?P<sep>\s*:\s*)(?P<v>'[^'\n]*'|\[[^\]\n]*\])")
# an argv written as JSON: "--hf-token", "value"
_JSON_ARGV = re.compile(r"(?P<k>\"-{1,2}[A-Za-z][A-Za-z0-9\-]*\")(?P<sep>\s*,\s*)(?P<v>\"(?!-)(?:[^\"\\]|\\.)*\")")
# Authorization: Bearer xyz
_AUTH_HEADER = re.compile(
    r"(?P<k>[Aa]uthorization)(?P<sep>[\"']?\s*[:=]\s*[\"']?)(?P<v>(?:Bearer|Basic|Token)\s+[^\s'\"]+)")
# Header-like "X-Api-Key: value", "Cookie: ..." lines
_HEADER = re.compile(r"(?P<k>(?<![A-Za-z0-9_\-])(?:X-)?[A-Za-z][A-Za-z0-9\-]*)(?P<sep>:[ \t]+)(?P<v>[^\s'\",]+)")
# JSON "api_key": "value"
_JSON_FIELD = re.compile(r"(?P<k>\"[A-Za-z0-9_.\-]+\")(?P<sep>\s*:\s*)(?P<v>\"(?:[^\"\\]|\\.)*\")")


def redact_text(text: str, extra_secrets: list[str] | None = None) -> str:
    """Replace secret values in free text; `extra_secrets` are literal values known to be secret."""
    for secret in extra_secrets or []:
        if secret and len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    return _redact_patterns(text) if len(text) < 512 else _redact_patterns.__wrapped__(text)


@lru_cache(maxsize=8192)
def _redact_patterns(text: str) -> str:
    """The patterns over one text; short texts repeat across a report (hosts, statuses, units): cached."""
    text = _URL_USERINFO.sub(_redact_userinfo, text)
    text = _AUTH_HEADER.sub(lambda m: f"{m.group('k')}{m.group('sep')}{_mask(m.group('v'))}", text)
    # after a secret flag the value is one, whatever it looks like (`--api-key <000>` is no placeholder)
    text = _KNOWN_FLAG.sub(lambda m: f"{m.group('k')}{m.group('sep')}{_mask(m.group('v'), placeholders=False)}", text)
    for pattern in (_ASSIGN, _FLAG, _JSON_FIELD, _JSON_ARGV, _PY_FIELD):
        text = pattern.sub(_redact_named, text)
    return _HEADER.sub(_redact_header, text)


def _redact_userinfo(m: re.Match[str]) -> str:
    return f"{m.group('scheme')}{REDACTED}@" if m.group("userinfo") != REDACTED else m.group(0)


def _redact_named(m: re.Match[str]) -> str:
    if not is_secret_name(m.group("k")):
        return m.group(0)
    return f"{m.group('k')}{m.group('sep')}{_mask(m.group('v'))}"


def _redact_header(m: re.Match[str]) -> str:
    # "key: value" alone is too common in logs and YAML to be a secret; "X-Api-Key: value" is one
    if m.group("k").upper() in ("KEY", "KEYS") or m.group("v").lower() in ("bearer", "basic", "token"):
        return m.group(0)  # the Authorization value was masked already (_AUTH_HEADER)
    return _redact_named(m)


def _mask(value: str, placeholders: bool = True) -> str:
    """The value masked, unless it is empty, already masked, or (`placeholders`) a placeholder in a message."""
    if value.startswith("["):
        return value if value in ("[]", f"['{REDACTED}']") else f"['{REDACTED}']"
    if value[:1] in ('"', "'"):
        quote = value[0]
        return value if value.strip(quote) in ("", REDACTED) else f"{quote}{REDACTED}{quote}"
    if value.lower().startswith(("bearer ", "basic ", "token ")):
        return value.split()[0] + " " + REDACTED
    if "KEY_USAGE" in value or value.lower() in ("", "none", "null", "true", "false") or value.startswith(REDACTED):
        return value
    if placeholders and value.startswith("<") and value.rstrip("`.,;)").endswith(">"):
        return value  # a placeholder in a message (`token=<your_token>`), not a value
    return REDACTED


def redact_obj(obj: Any, extra_secrets: list[str] | None = None) -> Any:
    """Redact a JSON-like structure: secret-named keys lose their string values, strings are scanned,
    and in an argv list the value after a secret flag (`["--api-key", "sk-..."]`) is replaced."""
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            if isinstance(key, str) and isinstance(value, str) and value and is_secret_name(key):
                out[key] = REDACTED
            else:
                out[key] = redact_obj(value, extra_secrets)
        return out
    if isinstance(obj, list):
        return _redact_argv([redact_obj(v, extra_secrets) for v in obj])
    if isinstance(obj, str):
        return redact_text(obj, extra_secrets)
    return obj


def _redact_argv(items: list[Any]) -> list[Any]:
    out = list(items)
    for i in range(len(out) - 1):
        flag = out[i]
        if (isinstance(flag, str) and flag.startswith("-") and "=" not in flag and " " not in flag
                and is_secret_name(flag) and isinstance(out[i + 1], str) and out[i + 1]
                and not out[i + 1].startswith("--")):
            out[i + 1] = REDACTED
    return out
