"""The weights' identity: which vLLM arguments change the model that serves (issue 42, item 1; docs/checks.md,
compat.served_model).

The profile names its model (``model.name``, ``model.path``, ``model.served_name``) and states its launch
(``launch.args``). It names no revision, quantization, config override, chat template or generation config: the
recipe serves its checkpoint as published (``recipes/vllm-project/Kimi-K3.yaml`` variants: the default checkpoint
is already quantized as shipped, MXFP4; another precision is another variant with its own ``model_id``), so any
of these arguments the profile does not state serves other weights, another config or another prompt format
behind the profile's name. The serve stage judges the running server by them (rules/served_model.py); the
inventory adding one (``vllm_serve_extra_args``, ``preflight_launch_args``) is refused at validation.

Flag names are vLLM 0.32's (vllm/engine/arg_utils.py ``EngineArgs.add_cli_args``, vllm/entrypoints/openai
``cli_args``; docs/sources.md#served-model-identity).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .argv import parse_flags

# vLLM argument (as its non-default args name it) -> what it changes about the model that serves.
IDENTITY_ARGS: dict[str, str] = {
    "model": "serves another checkpoint (model id or path)",
    "served_model_name": "answers to another name, or hides another model behind the profile's",
    "revision": "loads another revision of the checkpoint",
    "code_revision": "runs another revision of the model's code",
    "tokenizer": "tokenizes with another tokenizer",
    "tokenizer_revision": "tokenizes with another revision of the tokenizer",
    "hf_config_path": "reads the model's config from elsewhere",
    "hf_overrides": "overrides the checkpoint's config (architecture, experts per token, ...)",
    "quantization": "quantizes the weights otherwise than the checkpoint as shipped",
    "quantization_config": "quantizes the weights otherwise than the checkpoint as shipped",
    "dtype": "runs the weights at another precision",
    "chat_template": "formats prompts with another chat template than the checkpoint's",
    "override_generation_config": "overrides the checkpoint's sampling defaults",
    "generation_config": "reads sampling defaults from another generation config",
    "lora_modules": "serves LoRA adapters over the weights",
    "load_format": "loads no real weights (dummy: random values)",
}
# load_format changes the weights only as `dummy`; the others are loaders of the same files.
WEIGHTLESS_LOAD_FORMATS = ("dummy",)
# vLLM's short spelling of an identity flag (arg_utils.py: "--quantization", "-q").
SHORT_FLAGS = {"-q": "quantization"}
# The process runtime's role variables that name the model it loads and the name it serves (roles/vllm_serve).
MODEL_VARIABLES = {"vllm_serve_model_path": "model", "vllm_serve_served_name": "served_model_name"}
# The Hugging Face hub cache's directory of a model id at a commit (huggingface_hub file_download.py
# repo_folder_name: "models--<org>--<name>", then snapshots/<commit>; docs/sources.md#served-model-identity).
_HUB_SNAPSHOT = re.compile(r"(?:^|/)models--([^/]+?)--([^/]+)/snapshots/([^/]+)/?$")


def identity_key(key: str) -> str | None:
    """The identity argument a parsed flag name sets: itself, a dotted JSON sub-key of one (``hf_overrides.x``),
    or an abbreviation argparse would expand (``--quant``: vLLM's parser allows unambiguous prefixes); None."""
    base = key.split(".", 1)[0]
    if base in IDENTITY_ARGS:
        return base
    if len(base) >= 4:
        return next((name for name in IDENTITY_ARGS if name.startswith(base)), None)
    return None


def changes_weights(key: str, value: Any) -> bool:
    """Does identity argument `key` at `value` change the model that serves (load_format only as dummy)?"""
    if key == "load_format":
        return str(value).strip("'\"").lower() in WEIGHTLESS_LOAD_FORMATS
    return value is not None


def argv_identity_flags(args: Sequence[Any]) -> dict[str, Any]:
    """The identity arguments of an argv (``--flag v``, ``--flag=v``, ``-q v``, abbreviations, dotted keys)."""
    items = [str(a) for a in args]
    found: dict[str, Any] = {}
    for key, value in parse_flags(items).items():
        name = identity_key(key)
        if name is not None and changes_weights(name, value):
            found[name] = value
    for index, arg in enumerate(items):
        flag, sep, value = arg.partition("=")
        if flag in SHORT_FLAGS:
            found[SHORT_FLAGS[flag]] = value if sep else (items[index + 1] if index + 1 < len(items) else True)
    return found


def _parts(text: str) -> list[str]:
    norm = posixpath.normpath(text.strip().rstrip("/")) if text.strip() else ""
    return [p for p in norm.split("/") if p not in ("", ".")]


def names_model(served: str, accepted: str) -> bool:
    """Does the served model id or path name the accepted one: the same path, a path whose last components are the
    whole accepted id or relative path (a mounted model cache: ``/models/moonshotai/Kimi-K3``), or the hub cache's
    snapshot of that id? A shorter name (``Kimi-K3`` for ``moonshotai/Kimi-K3``) does not."""
    if not served or not accepted:
        return False
    hub = _HUB_SNAPSHOT.search(served.rstrip("/") + "/")
    if hub is not None and f"{hub.group(1)}/{hub.group(2)}" == accepted.strip("/"):
        return True
    mine, theirs = _parts(served), _parts(accepted)
    if not mine or not theirs:
        return False
    if accepted.startswith("/"):                 # an absolute path is that path, nothing shorter
        return served.startswith("/") and mine == theirs
    return len(mine) >= len(theirs) and mine[-len(theirs):] == theirs


def hub_revision(served: str) -> str | None:
    """The commit of a hub-cache snapshot path (recorded, not judged: the snapshot the cache holds of the id)."""
    hub = _HUB_SNAPSHOT.search(served.rstrip("/") + "/")
    return hub.group(3) if hub else None


def _stated(data: Mapping[str, Any]) -> dict[str, Any]:
    """The identity arguments the profile states: its launch.args, its model and the name it serves under."""
    launch = data.get("launch") if isinstance(data.get("launch"), Mapping) else {}
    model = data.get("model") if isinstance(data.get("model"), Mapping) else {}
    stated = argv_identity_flags(list(launch.get("args") or []))
    names = [str(model[k]) for k in ("path", "name") if model.get(k)]
    stated.setdefault("model", names)
    stated.setdefault("served_model_name", [str(model.get("served_name") or model.get("name"))])
    return stated


def _same(key: str, stated: Any, value: Any) -> bool:
    if key == "model":
        return any(names_model(str(value), str(s)) for s in stated)
    return str(value) in [str(s) for s in stated] if isinstance(stated, list) else str(stated) == str(value)


def identity_overrides(data: Mapping[str, Any], args: Any) -> dict[str, Any]:
    """The identity arguments of an inventory argv whose value the profile's launch.args do not state."""
    if not isinstance(args, list):
        return {}
    stated = _stated(data)
    return {k: v for k, v in argv_identity_flags(args).items() if k not in stated or not _same(k, stated[k], v)}


def launches_process(data: Mapping[str, Any], variables: Mapping[str, Any]) -> bool:
    """The run launches the profile's process runtime, the one launch that reads vllm_serve_model_path and
    vllm_serve_served_name (roles/vllm_serve/tasks/process.yml); attached, or a container launch, they are unused."""
    launch = data.get("launch") if isinstance(data.get("launch"), Mapping) else {}
    return variables.get("vllm_serve_mode", "launch") != "attach" and launch.get("runtime") == "process"


def identity_args_errors(data: Mapping[str, Any], variables: Mapping[str, Any], source: str,
                         model_variables: bool = True) -> list[str]:
    """One line per identity argument an inventory variable adds to the launch; refused before any node is touched
    (the serve stage would judge it compat.served_model: never a release). `model_variables`: the launch reads
    vllm_serve_model_path / vllm_serve_served_name (launches_process), so another model there is refused too."""
    lines = []
    for field in ("vllm_serve_extra_args", "preflight_launch_args"):
        for key, value in identity_overrides(data, variables.get(field)).items():
            flag = "--" + key.replace("_", "-")
            lines.append(f"{source}: field `{field}`: {flag} {value} {IDENTITY_ARGS[key]}: the run would accept "
                         "another model than the profile's; fix: remove it, or write profiles/<site>.yml (extends the "
                         f"profile) whose model (model.name, model.path, model.served_name) or launch.args state it "
                         "and set acceptance_profile to it")
    if not model_variables:
        return lines
    stated = _stated(data)
    for field, key in MODEL_VARIABLES.items():
        value = variables.get(field)
        if isinstance(value, str) and value and "{{" not in value and not _same(key, stated[key], value):
            lines.append(f"{source}: field `{field}`: {value!r} is not the profile's "
                         f"{' / '.join(map(repr, stated[key]))} ({IDENTITY_ARGS[key]}); fix: remove it, point it at "
                         "the profile's model, or write profiles/<site>.yml (extends the profile) whose model.path / "
                         "model.served_name state it and set acceptance_profile to it")
    return lines
