"""A launch's arguments with a limit's flags (roles/vllm_serve/tasks/relaunch.yml, serve/args.py)."""

from __future__ import annotations

import pytest

from vllm_acceptance.serve.args import with_flags


@pytest.mark.parametrize(("args", "flags", "expected"), [
    # the lab's pressure configuration: the old value goes, the new one is set once
    (["--enable-prefix-caching", "--max-num-seqs", "4", "--num-gpu-blocks-override", "24"], ["--max-num-seqs", "1"],
     ["--enable-prefix-caching", "--num-gpu-blocks-override", "24", "--max-num-seqs", "1"]),
    # the = form, and a flag the launch did not have
    (["--max-model-len=2048", "--max-num-seqs=8", "--enforce-eager"], ["--max-num-seqs", "4", "--max-model-len", "768"],
     ["--enforce-eager", "--max-num-seqs", "4", "--max-model-len", "768"]),
    # nothing to replace
    (["--enforce-eager"], ["--max-num-seqs", "2"], ["--enforce-eager", "--max-num-seqs", "2"]),
])
def test_the_limits_flags_replace_the_launchs_values(args: list[str], flags: list[str], expected: list[str]) -> None:
    assert with_flags(args, flags) == expected


def test_a_flag_given_without_its_value_keeps_the_next_option() -> None:
    assert with_flags(["--max-num-seqs", "--enforce-eager"], ["--max-num-seqs", "1"]) == [
        "--enforce-eager", "--max-num-seqs", "1"]
