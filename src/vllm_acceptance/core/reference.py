"""The agent probe's reference endpoint: its inventory variables, checked before any traffic.

`agent_reference_url`, `agent_reference_model`, `agent_reference_api_key_env` (docs/inventory.md "Agent reference",
docs/checks.md agent.reference_agreement). The key is read from the environment variable the user names and is
never a variable's value; credentials written into the URL (`https://user:token@host/v1`) are accepted and kept
out of evidence and messages (core/redact.py redacts a URL's user information; the password is a literal secret too).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from .profile import ConfigError
from .redact import redact_text

URL_VAR = "agent_reference_url"
MODEL_VAR = "agent_reference_model"
KEY_ENV_VAR = "agent_reference_api_key_env"
DEFAULT_KEY_ENV = "VLLM_REFERENCE_API_KEY"   # the CLI's --reference-api-key-env default (cli.py)
VARIABLES = (URL_VAR, MODEL_VAR, KEY_ENV_VAR)
# The quality probe's reference path (docs/acceptance.md "Output parity", docs/checks.md quality.parity): the same
# three variables, its own names; the key again from the environment variable named, never a variable's value.
QUALITY_URL_VAR = "quality_reference_url"
QUALITY_MODEL_VAR = "quality_reference_model"
QUALITY_KEY_ENV_VAR = "quality_reference_api_key_env"
QUALITY_DEFAULT_KEY_ENV = "VLLM_QUALITY_REFERENCE_API_KEY"
QUALITY_VARIABLES = (QUALITY_URL_VAR, QUALITY_MODEL_VAR, QUALITY_KEY_ENV_VAR)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FIX = "e.g. agent_reference_url: https://api.example.com/v1 (http or https, a host, the OpenAI base path)"


def url_error(url: str, field: str) -> str | None:
    """Why `url` is not an OpenAI base URL the probe can send to, naming `field` and the fix; None when it is.
    The URL in the message is redacted (its credentials never reach a log)."""
    shown = _shown(url)
    if not url.strip() or any(c.isspace() for c in url.strip()):
        return f"field `{field}`: {shown!r} is empty or holds spaces; {_FIX}"
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https"):
        return f"field `{field}`: {shown!r} is not an http(s) URL (scheme {parts.scheme or 'missing'!r}); {_FIX}"
    try:
        port = parts.port
        host = parts.hostname
    except ValueError:
        return f"field `{field}`: {shown!r} has a port that is not a number from 1 to 65535; {_FIX}"
    if not host:
        return f"field `{field}`: {shown!r} names no host; {_FIX}"
    if port == 0:
        return f"field `{field}`: {shown!r} has port 0; {_FIX}"
    if parts.query or parts.fragment:
        return f"field `{field}`: {shown!r} has a query or fragment; give the base URL only; {_FIX}"
    return None


def _shown(url: str) -> str:
    """The URL as a message may show it: credentials redacted, a query or fragment (it may carry a key) cut."""
    base, cut = re.split(r"[?#]", url, maxsplit=1)[0], re.search(r"[?#]", url)
    return redact_text(base) + ("?..." if cut else "")


def url_secrets(url: str | None) -> list[str]:
    """The credentials written in a URL (`https://user:token@host`): literal secrets for the evidence store."""
    if not url:
        return []
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return []
    return [s for s in (parts.password, parts.username if parts.password is None else None) if s]


def check_reference_url(url: str | None, field: str, api_key: str | None = None) -> None:
    """Raise ConfigError when a given reference URL is malformed (run_probe, before any request), or holds
    credentials while a key is given too: the HTTP client sends a URL's credentials as Basic auth, which
    replaces the key's Bearer header, so one of the two would be dropped without a word
    (docs/sources.md#httpx-url-auth)."""
    if url is None:
        return
    error = url_error(str(url), field)
    if error:
        raise ConfigError(f"reference endpoint: {error}")
    if api_key and url_secrets(str(url)):
        raise ConfigError(f"reference endpoint: field `{field}`: {_shown(str(url))!r} holds credentials and a key is "
                          f"given too (the environment variable named by {KEY_ENV_VAR}, default {DEFAULT_KEY_ENV}): "
                          "the URL's credentials would be sent as Basic auth in place of the key; give one of them")


def inventory_errors(variables: Mapping[str, Any], source: str) -> list[str]:
    """The agent_reference_* and quality_reference_* variables (core/variables.py check_variables): a malformed URL,
    a key variable that is not an environment name, a model or key without a URL. Types are the schema's
    (inventory.schema.json)."""
    return (_reference_errors(variables, source, URL_VAR, MODEL_VAR, KEY_ENV_VAR, DEFAULT_KEY_ENV)
            + _reference_errors(variables, source, QUALITY_URL_VAR, QUALITY_MODEL_VAR, QUALITY_KEY_ENV_VAR,
                                QUALITY_DEFAULT_KEY_ENV))


def _reference_errors(variables: Mapping[str, Any], source: str, url_var: str, model_var: str,
                      key_var: str, default_env: str) -> list[str]:
    errors: list[str] = []
    url = variables.get(url_var)
    if isinstance(url, str):
        error = url_error(url, url_var)
        if error:
            errors.append(f"{source}: {error}")
    env = variables.get(key_var)
    if isinstance(env, str) and not _ENV_NAME.match(env):
        # its value is not shown: a key pasted here by mistake stays out of the message
        errors.append(f"{source}: field `{key_var}`: is not an environment variable name (letters, digits, _); "
                      f"name the variable that holds the key, e.g. {key_var}: {default_env} (never the key "
                      "itself: it would be written in the inventory)")
    for name in (model_var, key_var):
        if variables.get(name) not in (None, "") and url in (None, ""):
            errors.append(f"{source}: field `{name}` is set but `{url_var}` is not: set {url_var} to the reference's "
                          f"OpenAI base URL, or remove {name}")
    return errors
