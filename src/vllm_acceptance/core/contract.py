"""The context contract against the context the launch serves (issue 31, item 6; docs/checks.md,
capacity.context_contract and compat.actual_config.max_model_len).

A session of the contract is ``contract.context_tokens`` + ``contract.max_output_tokens`` tokens. The launch
serves ``--max-model-len`` of ``launch.args`` (the last one wins, as in argparse), else ``model.max_model_len``.
A site contract below the recipe's ``--max-model-len`` follows the recipe ("Adjust max-model-len for different
benchmark scenarios", SPEC "Hardware the recipe verifies"); a contract above what the launch serves can never
be met, so such a profile is refused before any node is touched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .argv import parse_flags

FLAG = "--max-model-len"


def launch_flag_value(args: Sequence[Any], flag: str) -> str | None:
    """The value of the last ``--flag=V`` or ``--flag V`` in an argv list; None when absent."""
    value: str | None = None
    items = [str(a) for a in args]
    for index, arg in enumerate(items):
        if arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
        elif arg == flag and index + 1 < len(items):
            value = items[index + 1]
    return value


def _section(data: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = data.get(name)
    return value if isinstance(value, Mapping) else {}


def launch_max_model_len(data: Mapping[str, Any]) -> tuple[int | None, str]:
    """(the context the launch serves, the field it comes from)."""
    raw = launch_flag_value(_section(data, "launch").get("args") or [], FLAG)
    if raw is not None:
        try:
            return int(raw), f"launch.args ({FLAG}={raw})"
        except ValueError:
            return None, f"launch.args ({FLAG}={raw})"
    value = _section(data, "model").get("max_model_len")
    return (value if isinstance(value, int) and not isinstance(value, bool) else None), "model.max_model_len"


def contract_window(data: Mapping[str, Any]) -> int | None:
    """Tokens of one contracted session: context + max output; None when the contract lacks either."""
    contract = _section(data, "contract")
    context, output = contract.get("context_tokens"), contract.get("max_output_tokens")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (context, output)):
        return None
    return int(context) + int(output)


def contract_errors(data: Mapping[str, Any], source: str) -> list[str]:
    """One line when the contract exceeds what the launch serves, naming the fields and the fix."""
    window, (served, where) = contract_window(data), launch_max_model_len(data)
    if window is None or served is None or window <= served:
        return []
    contract = _section(data, "contract")
    output = int(contract["max_output_tokens"])
    lower = (f"lower contract.context_tokens to at most {served - output}" if served > output
             else f"lower contract.max_output_tokens below {served}")
    return [f"{source}: field `contract.context_tokens`: the contract (context_tokens {contract['context_tokens']} + "
            f"max_output_tokens {output} = {window} tokens) exceeds what the launch serves ({where}: {served}); "
            f"the server would reject contracted requests (allowed: context_tokens + max_output_tokens <= the served "
            f"{FLAG}; fix: {lower}, or raise {FLAG} in launch.args to at least {window})"]


def extra_args_errors(data: Mapping[str, Any], extra_args: Any, source: str) -> list[str]:
    """The inventory's ``vllm_serve_extra_args`` come after the profile's launch.args (roles/vllm_serve): a
    ``--max-model-len`` there below the contract would serve less than the contract; refused, naming the field."""
    if not isinstance(extra_args, list):
        return []
    raw = launch_flag_value(extra_args, FLAG)
    window = contract_window(data)
    if raw is None or window is None:
        return []
    try:
        served = int(raw)
    except ValueError:
        return [f"{source}: field `vllm_serve_extra_args`: {FLAG} {raw!r} is not a number of tokens (allowed: an "
                f"integer >= the contract's {window} tokens, e.g. {FLAG}={window})"]
    if served >= window:
        return []
    return [f"{source}: field `vllm_serve_extra_args`: {FLAG}={served} serves less than the profile's contract "
            f"({window} tokens: contract.context_tokens + contract.max_output_tokens); fix: raise it to at least "
            f"{window}, remove it (the profile's launch serves {launch_max_model_len(data)[0]}), or use a profile "
            "with a smaller contract"]


# vLLM arguments that cap what the server can carry (issue 28, item 4; docs/checks.md,
# compat.actual_config.unlisted_args): fewer sequences or batched tokens per step, no CUDA graphs, a draft model,
# KV moved off the GPU or to another instance, weights offloaded. One the profile does not state, with its value,
# changes the capacity the acceptance signs. --max-num-seqs limits the contract only below its concurrency and
# --max-model-len only below its window (context + max output); at or above them they are recorded, not judged.
LIMITING_ARGS: dict[str, str] = {
    "max_num_seqs": "caps the concurrent sequences per engine",
    "max_num_batched_tokens": "caps the tokens scheduled per step",
    "enforce_eager": "turns CUDA graphs off (slower decode)",
    "speculative_config": "adds speculative decoding (another model's or method's behaviour and memory)",
    "kv_transfer_config": "moves KV cache to or from another instance (disaggregated serving, KV connectors)",
    "kv_offloading_size": "offloads KV cache off the GPU",
    "kv_offloading_backend": "offloads KV cache off the GPU",
    "cpu_offload_gb": "offloads weights to CPU memory",
}


# Arguments that apply per engine. Each data-parallel rank is an engine (EngineCore) with its own Scheduler built
# from the one SchedulerConfig (vllm/v1/engine/core.py EngineCore.__init__: self.scheduler = Scheduler(...)):
# vllm/v1/core/sched/scheduler.py caps the running requests at scheduler_config.max_num_seqs and each step's tokens
# at scheduler_config.max_num_batched_tokens, per engine. The contract is served by every engine of the launch at
# once (the data-parallel size, docs/sources.md#vllm-argument-checks): --max-num-seqs N serves N x engines.
PER_ENGINE_ARGS = ("max_num_seqs", "max_num_batched_tokens")
# vLLM's largest default --max-num-batched-tokens of the API server on a GPU (>= 160 GiB; hardware.py
# vllm_batched_tokens_default): where the GPU is unknown, a value below it may lower vLLM's default.
LARGEST_GPU_BATCHED_TOKENS = 16384


def _as_int(value: Any) -> int | None:
    try:
        return int(str(value))
    except ValueError:
        return None


def launch_engines(data: Mapping[str, Any], variables: Mapping[str, Any] | None = None) -> int:
    """The engines that serve the contract: the launch's data-parallel size (the inventory's vllm_parallel.data,
    else the profile's parallel.data), 1 without data parallel."""
    given = ((variables or {}).get("vllm_parallel") or {}) if isinstance((variables or {}).get("vllm_parallel"),
                                                                      Mapping) else {}
    for value in (given.get("data"), _section(data, "parallel").get("data")):
        count = _as_int(value) if value is not None else None
        if count is not None and count >= 1:
            return count
    return 1


def chunked_prefill_off(data: Mapping[str, Any], args: Any = None) -> bool:
    """--no-enable-chunked-prefill in the profile's launch.args or the given argv (the last one wins)."""
    flags = _flags([*(_section(data, "launch").get("args") or []), *(args if isinstance(args, list) else [])])
    return flags.get("enable_chunked_prefill") is False or str(flags.get("enable_chunked_prefill")).lower() == "false"


def limits_contract(data: Mapping[str, Any], key: str, value: Any, *, engines: int = 1,
                    batched_tokens_default: int | None = None, chunked_prefill: bool = True) -> str | None:
    """Why argument `key`=`value` (not stated by the profile) limits the contract's capacity; None when it does not.
    A per-engine argument (PER_ENGINE_ARGS) counts once per engine: --max-num-seqs 32 on 16 engines serves 512.
    --max-num-batched-tokens limits below vLLM's default for the hardware (`batched_tokens_default`; unknown: the
    largest GPU default) and, without chunked prefill, below one contracted request's window; raising it does not."""
    if value in (None, False) or str(value).lower() == "false":
        return None
    if key == "max_num_seqs":
        want, got = _section(data, "contract").get("concurrency"), _as_int(value)
        served = got * max(1, engines) if got is not None else None
        if isinstance(want, int) and served is not None and served >= want:
            return None
        per = f" per engine x {engines} engines = {served}" if engines > 1 and served is not None else ""
        return f"{LIMITING_ARGS[key]}: {value}{per}, below the contract's {want} concurrent sessions"
    if key == "max_num_batched_tokens":
        return _batched_tokens_limit(data, value, batched_tokens_default, chunked_prefill)
    if key == "max_model_len":
        window, got = contract_window(data), _as_int(value)
        if window is None or got is None or got >= window:
            return None
        return f"serves {got} tokens, below the contract's {window} (context + max output)"
    return LIMITING_ARGS.get(key)


def _batched_tokens_limit(data: Mapping[str, Any], value: Any, default: int | None, chunked: bool) -> str | None:
    got, window = _as_int(value), contract_window(data)
    if got is None:
        return f"{LIMITING_ARGS['max_num_batched_tokens']}: {value!r} is not a number of tokens"
    if not chunked and window is not None and got < window:
        return (f"{LIMITING_ARGS['max_num_batched_tokens']}: {got}, and without chunked prefill one contracted "
                f"request ({window} tokens: context + max output) must fit one step")
    floor = default if default is not None else LARGEST_GPU_BATCHED_TOKENS
    if got >= floor:
        return None
    known = (f"vLLM's default for this hardware ({default})" if default is not None else
             f"the largest default vLLM gives a GPU ({LARGEST_GPU_BATCHED_TOKENS}; this hardware's is unknown)")
    return (f"{LIMITING_ARGS['max_num_batched_tokens']} per engine: {got}, below {known}: long prompts take more "
            "steps to prefill")


def _flags(args: Sequence[Any]) -> dict[str, Any]:
    return parse_flags([str(a) for a in args])


def limiting_overrides(data: Mapping[str, Any], args: Any, *, engines: int = 1,
                       batched_tokens_default: int | None = None) -> dict[str, str]:
    """The capacity-limiting arguments of an inventory argv (vllm_serve_extra_args, preflight_launch_args) whose
    value the profile's launch.args do not state: {--flag value: why}, per-engine arguments counted once per
    engine. --max-model-len is extra_args_errors'."""
    if not isinstance(args, list):
        return {}
    stated = _flags(_section(data, "launch").get("args") or [])
    chunked = not chunked_prefill_off(data, args)
    out = {}
    for key, value in _flags(args).items():
        why = limits_contract(data, key, value, engines=engines, batched_tokens_default=batched_tokens_default,
                              chunked_prefill=chunked) \
            if key in LIMITING_ARGS and str(stated.get(key)) != str(value) else None
        if why:
            flag = "--" + key.replace("_", "-")
            out[flag if value is True else f"{flag} {value}"] = why
    return out


def limiting_args_errors(data: Mapping[str, Any], variables: Mapping[str, Any], source: str, *,
                         engines: int | None = None, batched_tokens_default: int | None = None) -> list[str]:
    """One line per capacity-limiting argument an inventory variable adds to the launch; refused before any node
    is touched (the serve stage would judge it compat.actual_config.unlisted_args: never a release)."""
    lines = []
    count = engines if engines is not None else launch_engines(data, variables)
    for field in ("vllm_serve_extra_args", "preflight_launch_args"):
        for shown, why in limiting_overrides(data, variables.get(field), engines=count,
                                             batched_tokens_default=batched_tokens_default).items():
            lines.append(f"{source}: field `{field}`: {shown} {why}: the run would accept a server weaker than the "
                         "profile's launch; fix: remove it, or write profiles/<site>.yml (extends the profile) whose "
                         f"launch.args state {shown} and set acceptance_profile to it")
    return lines


def per_engine_capacity(data: Mapping[str, Any], args: Sequence[Any], engines: int) -> list[str]:
    """What the launch's per-engine arguments serve in all, beside the contract (the plan prints it)."""
    flags = _flags(args)
    out = []
    seqs = _as_int(flags["max_num_seqs"]) if "max_num_seqs" in flags else None
    want = _section(data, "contract").get("concurrency")
    if seqs is not None:
        out.append(f"--max-num-seqs {seqs} per engine x {engines} engine(s) = {seqs * engines} concurrent "
                   f"sequences for the contract's {want}")
    tokens = _as_int(flags["max_num_batched_tokens"]) if "max_num_batched_tokens" in flags else None
    if tokens is not None:
        out.append(f"--max-num-batched-tokens {tokens} per engine step x {engines} engine(s)")
    return out


# The distributed load stage's shape (playbooks/loadgen.yml): each loadgen_* value below the profile's load
# section weakens the step the contract is judged by (issue 28, item 8). loadgen_concurrency is per host and
# its total depends on the host count: probes/loadmerge.py judges it.
LOADGEN_FLOORS: dict[str, str] = {
    "loadgen_prompt_tokens": "load.prompt_tokens",
    "loadgen_output_tokens": "load.output_tokens",
}


def loadgen_errors(data: Mapping[str, Any], variables: Mapping[str, Any], source: str) -> list[str]:
    lines = []
    load = _section(data, "load")
    for field, floor in LOADGEN_FLOORS.items():
        value, want = variables.get(field), load.get(floor.split(".", 1)[1])
        try:
            low = value is not None and want is not None and int(value) < int(want)
        except (TypeError, ValueError):
            continue
        if low:
            lines.append(f"{source}: field `{field}`: {value} is below the profile's {floor} ({want}): the "
                         f"distributed load would run below the contract's shape; fix: remove {field} (the default "
                         f"is the profile's), set it to at least {want}, or write a site profile with that load")
    return lines
