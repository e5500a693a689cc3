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
