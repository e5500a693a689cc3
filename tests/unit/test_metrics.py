"""Exposition parsing: both name forms, absent families stay absent, garbage is a clear error."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_acceptance.runtime.metrics import (
    MetricsError,
    cache_config,
    canonical,
    delta,
    missing_families,
    parse_exposition,
)

TEXT = """# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1408.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 0.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",enable_prefix_caching="True",engine="0"} 1.0
# TYPE vllm:prompt_tokens_cached_by_source_total counter
vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="device"} 1280.0
vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="external_unspecified"} 128.0
"""


def test_colon_and_underscore_forms_are_the_same_family() -> None:
    a = parse_exposition(TEXT)
    b = parse_exposition(TEXT.replace("vllm:", "vllm_"))
    assert canonical("vllm_prefix_cache_hits_total") == "vllm:prefix_cache_hits"
    assert a.value("vllm:prefix_cache_hits") == b.value("vllm_prefix_cache_hits_total") == 1408.0
    assert a.value("vllm:prompt_tokens_cached_by_source", source="device") == 1280.0
    assert cache_config(b) == {"block_size": "128", "enable_prefix_caching": "True", "engine": "0"}


def test_absent_family_is_none_not_zero() -> None:
    snap = parse_exposition(TEXT)
    assert snap.value("vllm:prefix_cache_queries") is None
    assert delta(snap, snap, "vllm:prefix_cache_queries") is None
    assert missing_families(snap, ["vllm:prefix_cache_queries", "vllm:num_requests_running"]) == \
        ["vllm:prefix_cache_queries"]


def test_removed_0x_names_do_not_count_as_current_ones() -> None:
    old = parse_exposition('vllm:gpu_prefix_cache_hits_total{engine="0"} 5\n')
    assert old.value("vllm:prefix_cache_hits") is None


def test_delta_of_counters() -> None:
    before = parse_exposition(TEXT)
    after = parse_exposition(TEXT.replace("1408.0", "2816.0"))
    assert delta(before, after, "vllm:prefix_cache_hits") == 1408.0


@pytest.mark.parametrize("garbage", ["<html><body>502 Bad Gateway</body></html>", "{\"error\": 1}",
                                     "vllm:x{a=\"1\" 3\n"])
def test_text_that_is_not_the_format_is_a_clear_error(garbage: str) -> None:
    with pytest.raises(MetricsError):
        parse_exposition(garbage)


@given(st.text(max_size=300))
def test_parser_never_raises_anything_but_metrics_error(text: str) -> None:
    with contextlib.suppress(MetricsError):
        parse_exposition(text)
