"""Secret redaction: API keys, tokens, passwords and URL credentials never reach evidence, logs or reports.

What counts as a secret (docs/acceptance.md "Contracts": secrets never reach evidence or reports):
- the value of a variable, flag or JSON field whose name is secret-bearing (SECRET_NAME): one of its
  parts (split on `_`, `-`, `.`) is TOKEN, SECRET, PASSWORD, PASSWD, PASS, APIKEY, CREDENTIAL(S), AUTH,
  AUTHORIZATION, COOKIE, or it ends in KEY as an environment name (OPENAI_API_KEY, AWS_SECRET_ACCESS_KEY) or
  after a qualifier (api_key, private-key, accessKey; not `key`, `sort_keys`, `idempotency_key`);
  counters such as `prompt_tokens` or `max_num_batched_tokens` are left alone (TOKENS is not TOKEN);
- the user information of a URL (`scheme://user:password@host`, `https://token@github.com/...`): the
  whole `user:password` part is replaced, the scheme, host, port and path stay readable;
- an `Authorization: Bearer|Basic ...` header value, and literal values known to be secret (extra_secrets);
- a URL query's secret parameters (`?api-key=`, `&token=`, `X-Amz-Signature=`, `sig=`, `key=`, ...);
- values recognisable by their shape wherever they stand: GitHub tokens (ghp_, gho_, ghu_, ghs_, ghr_,
  github_pat_), Slack webhooks and xox tokens, Hugging Face tokens (hf_), AWS access key ids (AKIA...), OpenAI-style
  keys (sk-...), JWTs, `Bearer <token>`, PEM private keys, and long base64 blobs that decode to a kubeconfig, a PEM
  or a credentials file; `user:pass` as the value of an environment name (`MY_CREDS=user:pass`).

Environment dumps are written by allow-list (redact_env): a variable keeps its value only when a check reads it
(ENV_READ_PREFIXES, ENV_READ_NAMES, and the launch environment the profile and inventory name); any other is
recorded by name only (NOT_RECORDED). A kept value still passes through the redaction above.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

REDACTED = "***REDACTED***"
# What environment evidence holds for a variable no check reads (redact_env): its name only. No value follows it,
# so no later pass masks it as one.
NOT_RECORDED = "<not recorded: not read by any check>"

# Parts of a name that make its value a secret (HF_TOKEN, DB_PASSWORD, NCCL_AUTH_TOKEN, GITHUB_TOKEN_RO).
_SECRET_PARTS = frozenset({"TOKEN", "SECRET", "SECRETS", "PASSWORD", "PASSWORDS", "PASSWD", "PASS", "PWD",
                           "APIKEY", "CREDENTIAL", "CREDENTIALS", "CRED", "CREDS", "AUTH", "AUTHORIZATION", "COOKIE",
                           "PASSPHRASE"})
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
_ASSIGN = re.compile(r"(?P<k>(?<![A-Za-z0-9_.\-])[A-Za-z_][A-Za-z0-9_.\-]*)(?P<sep>=)"
                     rf"(?P<v>(?!{re.escape(NOT_RECORDED[:14])})[^\s'\",&;]+)")
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
    r"(?P<k>[Aa]uthorization)(?P<sep>[\"']?\s*[:=]\s*[\"']?)(?P<v>(?i:Bearer|Basic|Token)\s+[^\s'\"]+)")
# Header-like "X-Api-Key: value", "Cookie: ..." lines
_HEADER = re.compile(r"(?P<k>(?<![A-Za-z0-9_\-])(?:X-)?[A-Za-z][A-Za-z0-9\-]*)(?P<sep>:[ \t]+)(?P<v>[^\s'\",]+)")
# JSON "api_key": "value"
_JSON_FIELD = re.compile(r"(?P<k>\"[A-Za-z0-9_.\-]+\")(?P<sep>\s*:\s*)(?P<v>\"(?:[^\"\\]|\\.)*\")")
# A URL query's parameters that carry a secret whatever is_secret_name says of them (pre-signed S3/GCS URLs, Azure
# SAS signatures, webhooks' `key=`); a secret-named parameter (`?access_token=`) is one too.
_QUERY = re.compile(r"(?P<k>(?<=[?&])[A-Za-z0-9_.\-]+)(?P<sep>=)(?P<v>[^&#\s'\"<>()\\]+)")
_QUERY_SECRETS = frozenset({"api-key", "api_key", "apikey", "token", "access_token", "id_token", "refresh_token",
                            "auth", "key", "sig", "signature", "secret", "client_secret", "password", "passwd", "pass",
                            "code", "x-amz-signature", "x-amz-credential", "x-amz-security-token",
                            "x-goog-signature", "x-goog-credential", "awsaccesskeyid", "credential"})
# Values recognisable by their shape, wherever they stand (module docstring).
_SHAPED = re.compile(r"""(?x)
      \b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{12,}                   # GitHub tokens
    | \bgithub_pat_[A-Za-z0-9_]{20,}                                # GitHub fine-grained tokens
    | \bxox[abposre]-[A-Za-z0-9\-]{8,}                              # Slack tokens
    | \bhf_[A-Za-z0-9]{16,}                                         # Hugging Face tokens
    | \b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b   # AWS access key ids
    | \bsk-(?:proj-|ant-|svcacct-)?[A-Za-z0-9_\-]{20,}              # OpenAI / Anthropic style keys
    | \beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}   # JSON web tokens
""")
# Webhook URLs are their own secret: the path after the service's prefix is the credential.
_WEBHOOK = re.compile(r"(?P<k>https?://(?:hooks\.slack\.com/(?:services|workflows|triggers)/"
                      r"|(?:[a-z]+\.)?discord(?:app)?\.com/api/webhooks/))(?P<v>[A-Za-z0-9/_\-]+)")
# `Bearer <token>` anywhere (a curl line, a log): the token has a digit or a token's punctuation, so the words
# "Bearer token" stay as they are.
_BEARER = re.compile(r"(?P<k>\b(?i:bearer)\s+)(?P<v>(?=[A-Za-z0-9\-._~+/]*[0-9\-._~+/])[A-Za-z0-9\-._~+/]{8,}=*)")
# A PEM private key, whole (to its END line, or to the end of the text when cut); `\n` may be literal in JSON.
_PEM = re.compile(r"-----BEGIN (?P<kind>[A-Z0-9 ]*)PRIVATE KEY-----.*?(?:-----END (?P=kind)PRIVATE KEY-----|\Z)",
                  re.DOTALL)
# Base64 long enough to hold a credential file; masked only when it decodes to one (_DECODED_SECRET).
_BASE64 = re.compile(r"(?<![A-Za-z0-9+/_\-])[A-Za-z0-9+/_\-]{48,}={0,2}")
_DECODED_SECRET = re.compile(r"-----BEGIN|PRIVATE KEY|client-key-data|client-certificate-data|\bclusters:|"
                             r"\busers:|\bcontexts:|apiVersion:|\btoken:|\bpassword|\"auths\"|aws_secret_access_key|"
                             r"\"private_key\"|\bsecret", re.IGNORECASE)
# `user:pass` as the value of an environment name (MY_CREDS=user:pass); `host:port`, `a:1`, `a:0.6` and a setting
# `name:True` (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) are left alone.
_ENV_ASSIGN = re.compile(r"(?P<k>(?<![A-Za-z0-9_.\-])[A-Z_][A-Z0-9_]*)(?P<sep>=)"
                         r"(?P<v>[A-Za-z0-9._%+\-~]+:(?!(?:[0-9.]+|True|False|true|false)(?:[\s'\",&;]|$))"
                         r"[^\s'\",&;:/@=]+)(?=[\s'\",&;]|$)")


def redact_text(text: str, extra_secrets: list[str] | None = None) -> str:
    """Replace secret values in free text; `extra_secrets` are literal values known to be secret."""
    for secret in extra_secrets or []:
        if secret and len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    return _redact_patterns(text) if len(text) < 512 else _redact_patterns.__wrapped__(text)


@lru_cache(maxsize=8192)
def _redact_patterns(text: str) -> str:
    """The patterns over one text; short texts repeat across a report (hosts, statuses, units): cached."""
    text = _PEM.sub(REDACTED, text)
    text = _URL_USERINFO.sub(_redact_userinfo, text)
    text = _WEBHOOK.sub(lambda m: f"{m.group('k')}{REDACTED}", text)
    text = _QUERY.sub(_redact_query, text)
    text = _SHAPED.sub(REDACTED, text)
    text = _BEARER.sub(lambda m: f"{m.group('k')}{REDACTED}", text)
    text = _BASE64.sub(_redact_base64, text)
    text = _ENV_ASSIGN.sub(lambda m: f"{m.group('k')}{m.group('sep')}{REDACTED}", text)
    text = _AUTH_HEADER.sub(lambda m: f"{m.group('k')}{m.group('sep')}{_mask(m.group('v'))}", text)
    # after a secret flag the value is one, whatever it looks like (`--api-key <000>` is no placeholder)
    text = _KNOWN_FLAG.sub(lambda m: f"{m.group('k')}{m.group('sep')}{_mask(m.group('v'), placeholders=False)}", text)
    for pattern in (_ASSIGN, _FLAG, _JSON_FIELD, _JSON_ARGV, _PY_FIELD):
        text = pattern.sub(_redact_named, text)
    return _HEADER.sub(_redact_header, text)


def _redact_userinfo(m: re.Match[str]) -> str:
    return f"{m.group('scheme')}{REDACTED}@" if m.group("userinfo") != REDACTED else m.group(0)


def _redact_query(m: re.Match[str]) -> str:
    if m.group("k").lower() in _QUERY_SECRETS or is_secret_name(m.group("k")):
        return f"{m.group('k')}{m.group('sep')}{_mask(m.group('v'))}"
    return m.group(0)


def _redact_base64(m: re.Match[str]) -> str:
    return REDACTED if decodes_to_secret(m.group(0)) else m.group(0)


def decodes_to_secret(blob: str) -> bool:
    """True when `blob` is base64 (standard or URL-safe) of a kubeconfig, a PEM key or another credential file."""
    text = blob.strip()
    if len(text) < 16:
        return False
    try:
        raw = base64.b64decode(text.replace("-", "+").replace("_", "/") + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        return False
    decoded = raw[:65536].decode("utf-8", errors="replace")
    if decoded.count("\ufffd") > len(decoded) // 10:
        return False  # binary, not a text file (a digest, a compressed layer)
    if _DECODED_SECRET.search(decoded):
        return True
    inner = decoded.strip()   # base64 of base64 (a Kubernetes Secret's data holding a kubeconfig)
    return len(inner) >= 48 and _BASE64.fullmatch(inner) is not None and decodes_to_secret(inner)


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
            if (isinstance(key, str) and isinstance(value, str) and value and value != NOT_RECORDED
                    and is_secret_name(key)):
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


# --- environment evidence by allow-list (issue 42 item 6) ---------------------------------------------------------
# What the checks read of an environment, and so what an env dump, a live process's environment or an image's
# Env keeps the value of (tests/unit/test_redact_env.py derives these from the rules' own reads and fails when a
# rule reads a name this list drops):
# - the communication settings interconnect.nccl_env, compat.defects and the live-launch comparison judge
#   (parsers/env.py COMM_PREFIXES, data/known_defects.yml workaround_env, parsers/live.py compare_launch);
# - NVIDIA_* (NVIDIA_IMEX_CHANNELS, NVIDIA_VISIBLE_DEVICES: the container toolkit's, roles/preflight commands),
#   NV_CUDA_* and CUDA_* (parsers/container.py: the image's CUDA from CUDA_VERSION / NV_CUDA_CUDART_VERSION);
# - HF_HUB_OFFLINE (serve/vllm_argcheck.py);
# - and every name the launch sets, passed as `read`: the run's profile (launch.env, site_env, each interconnect's
#   multinode env, the DMA-BUF workaround: preflight/stage.py profile_env_names) and the inventory's override
#   (the `launch_env` of the node's inputs).
ENV_READ_PREFIXES = ("NCCL_", "UCX_", "NVSHMEM_", "CUDA_", "VLLM_", "GLOO_", "TORCH_NCCL", "NVIDIA_", "NV_CUDA_")
ENV_READ_NAMES = frozenset({"HF_HUB_OFFLINE"})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def env_value_read(name: str, read: Iterable[str] = ()) -> bool:
    """True when a check reads this variable's value (module section above), so evidence keeps it."""
    return name.startswith(ENV_READ_PREFIXES) or name in ENV_READ_NAMES or name in set(read)


def env_value(name: str, value: str, read: Iterable[str] = (), extra_secrets: list[str] | None = None) -> str:
    """The value evidence keeps for one variable: NOT_RECORDED unless a check reads it; a read one redacted still
    (a secret name loses its value, a URL its credentials)."""
    if not env_value_read(name, read):
        return NOT_RECORDED
    if value and is_secret_name(name):
        return REDACTED
    return redact_text(value, extra_secrets)


def redact_env(env: Mapping[str, Any], read: Iterable[str] = (),
               extra_secrets: list[str] | None = None) -> dict[str, str]:
    """An environment mapping as evidence keeps it (env_value for each variable)."""
    names = set(read)
    return {str(k): env_value(str(k), str(v), names, extra_secrets) for k, v in env.items()}


def redact_env_list(items: Iterable[Any], read: Iterable[str] = (),
                    extra_secrets: list[str] | None = None) -> list[Any]:
    """A `NAME=value` list (an image's Config.Env) as evidence keeps it."""
    names = set(read)
    out: list[Any] = []
    for item in items:
        name, sep, value = str(item).partition("=")
        out.append(f"{name}={env_value(name, value, names, extra_secrets)}" if sep and _ENV_NAME.match(name)
                   else redact_text(str(item), extra_secrets))
    return out


def redact_env_text(text: str, read: Iterable[str] = (), extra_secrets: list[str] | None = None) -> str:
    """`env` output as evidence keeps it, sorted by name: a multi-line value's continuation lines go with their
    variable (kept, redacted, only when it is read); lines before the first variable are redacted text."""
    names = set(read)
    head: list[str] = []
    entries: dict[str, list[str]] = {}
    last: str | None = None
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and _ENV_NAME.match(name):
            last = name
            entries[name] = [value]
        elif last is not None:
            entries[last].append(line)
        else:
            head.append(redact_text(line, extra_secrets))
    out = list(head)
    for name in sorted(entries):
        if not env_value_read(name, names):
            out.append(f"{name}={NOT_RECORDED}")
            continue
        lines = entries[name]
        out.append(f"{name}={env_value(name, chr(10).join(lines), names, extra_secrets)}")
    return "\n".join(out) + ("\n" if out else "")
