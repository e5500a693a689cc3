"""What in a deployment changes the arithmetic against the accepted path (docs/acceptance.md "Output parity"):
P/D pools, a speculative config, an fp8 KV cache, decode context parallel. The quality probe proves such a
deployment's answers against a reference.

Where the deployment itself carries a path the accepted single-engine serving does not -- P/D pools (the reference
is free: a prefill instance called directly) and speculative decoding (the recipe's opt-in feature) -- the quality
stage is required, named in acceptance_probes or not (report/build.py selected_stages), and a run without it is
incomplete, never a release. An fp8 KV cache and DCP are compared only when the profile asks (`quality.path`): the
K3 recipe's own launch serves fp8 KV, so that is the accepted path itself, and its comparison needs a second
deployment of the same weights that a site chooses to book."""

from __future__ import annotations

from typing import Any

from .argv import parse_flags
from .profile_model import ProfileModel

_SPEC = "speculative_config"
_KV_DTYPE = "kv_cache_dtype"
_DCP = "decode_context_parallel_size"


def launch_paths(args: list[Any]) -> list[str]:
    """The paths a launch's vLLM arguments take: speculative decoding, an fp8 KV cache, decode context parallel."""
    text = [str(a) for a in args or []]
    flags = parse_flags([("--decode-context-parallel-size" + a[4:]) if a.startswith("-dcp") else a for a in text])
    out: list[str] = []
    if flags.get(_SPEC) not in (None, False, "", "null", "None"):
        out.append("speculative decoding (--speculative-config)")
    kv = flags.get(_KV_DTYPE)
    if kv is not None and "fp8" in str(kv).lower():
        out.append(f"fp8 KV cache (--kv-cache-dtype {kv})")
    dcp = flags.get(_DCP)
    if dcp is not None and str(dcp).isdigit() and int(str(dcp)) > 1:
        out.append(f"decode context parallel (--decode-context-parallel-size {dcp})")
    return out


def profile_paths(model: ProfileModel) -> list[str]:
    """The paths a profile (its typed model) deploys: P/D pools (`pd`) and each launch's arguments."""
    out: list[str] = []
    launches = [model.launch]
    if model.pd is not None:
        out.append("P/D pools decode, prefill")
        launches += [model.pd.prefill.launch, model.pd.decode.launch]
    for launch in launches:
        for path in launch_paths(list(launch.args or [])):
            if path not in out:
                out.append(path)
    return out


REQUIRED = ("P/D pools", "speculative decoding")


def required_paths(model: ProfileModel) -> list[str]:
    """The paths for which the quality stage is required (the module's docstring says why these)."""
    return [p for p in profile_paths(model) if p.startswith(REQUIRED)]
