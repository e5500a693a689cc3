"""vLLM startup log scan, RDMA and nccl-tests parsers; never raising."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_acceptance.parsers.nccl_tests import parse_all_reduce_perf
from vllm_acceptance.parsers.rdma import parse_ibv_devinfo, parse_rdma_link
from vllm_acceptance.parsers.startup_log import scan_startup_log

from nodefixtures import NODES


def read(case: str, name: str) -> str:
    return (NODES / case / name).read_text()


def test_good_startup_log_reads_out_everything() -> None:
    scan = scan_startup_log(read("good", "startup.log"))
    assert scan.ok and scan.version == "0.28.0" and scan.model == "moonshotai/Kimi-K3"
    assert scan.platform == "cuda" and scan.dist_backend == "nccl" and scan.world_size == 8
    assert len(scan.tp_ranks) == 8 and scan.attention_backends == ["FLASHINFER_MLA"]
    assert scan.kv_cache_pool == "GPU" and scan.kv_cache_tokens == 3276800
    assert scan.max_concurrency == 3.12 and scan.max_concurrency_len == 1048576
    assert scan.non_default_args["tensor_parallel_size"] == 8
    assert scan.ready and scan.failure_class() is None
    assert len(scan.warnings) == 2 and not scan.fallbacks and not scan.nccl_errors


def test_nccl_error_log() -> None:
    scan = scan_startup_log(read("nccl-error", "startup.log"))
    assert scan.dmabuf_errno == 524 and scan.dmabuf_errors
    assert any("unhandled system error" in line.text for line in scan.nccl_errors)
    assert scan.failure_class() == "communication" and scan.engine_failed and not scan.ready


def test_driver_refusal_is_an_environment_failure() -> None:
    scan = scan_startup_log(read("driver-575", "startup.log"))
    assert scan.failure_class() == "environment" and scan.driver_incompatible


def test_exact_vllm_messages() -> None:
    log = "\n".join([
        "(APIServer pid=7) INFO 11-30 10:00:00 [api_utils.py:331] vLLM server version 0.32.0, serving model tiny",
        "(EngineCore pid=9) INFO 11-30 10:00:05 [kv_cache_utils.py:2328] CPU KV cache size: 7,280 tokens, "
        "Maximum concurrency for 2,048 tokens per request: 3.55x",
        "(EngineCore pid=9) WARNING 11-30 10:00:06 [model.py:2440] Your device 'NVIDIA GB300' doesn't support "
        "torch.bfloat16. Falling back to torch.float16 for compatibility.",
        "(EngineCore pid=9) WARNING 11-30 10:00:07 [tensor_ipc.py:101] Falling back to standard serialization.",
        "RuntimeError: CUDA error: no kernel image is available for execution on the device",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        "RuntimeError: The NVIDIA driver on your system is too old (found version 12090).",
    ])
    scan = scan_startup_log(log)
    assert scan.version == "0.32.0" and scan.model == "tiny" and scan.kv_cache_pool == "CPU"
    assert scan.kv_cache_tokens == 7280 and scan.max_concurrency == 3.55
    assert len(scan.fallbacks) == 2 and len(scan.backend_fallbacks) == 1   # dtype yes, serialisation no
    assert scan.no_kernel_image and scan.oom and scan.driver_incompatible
    assert scan.failure_class() == "environment"


def test_colour_codes_and_crlf_are_stripped() -> None:
    log = ("\x1b[32m(APIServer pid=1) INFO 11-30 10:00:00 [a.py:1] vLLM server version 0.32.0, "
           "serving model m\x1b[0m\r\n")
    assert scan_startup_log(log).version == "0.32.0"


def test_empty_or_foreign_log() -> None:
    assert not scan_startup_log("").ok
    scan = scan_startup_log("hello\nworld")
    assert scan.version is None and not scan.ok and scan.failure_class() is None


def test_rdma() -> None:
    ibv = parse_ibv_devinfo(read("good", "ibv_devinfo.txt"))
    assert ibv.devices == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"] and len(ibv.active_ports) == 4
    assert ibv.ports[0].link_layer == "InfiniBand"
    link = parse_rdma_link(read("good", "rdma-link.txt"))
    assert len(link.active_ports) == 4
    down = parse_rdma_link("link mlx5_0/1 state DOWN physical_state DISABLED netdev eth2\n")
    assert down.ports and not down.active_ports
    assert not parse_ibv_devinfo("No IB devices found").ok


def test_nccl_tests() -> None:
    perf = parse_all_reduce_perf(read("good", "all_reduce_perf.txt"))
    assert perf.ok and perf.ranks == 8 and perf.hosts == ["gb300-n01"]
    assert perf.max_busbw == 843.9 and perf.wrong_results == 0 and perf.out_of_bounds == 0
    assert not parse_all_reduce_perf("all_reduce_perf: command not found").ok


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_log_parsers_never_raise(text: str) -> None:
    scan_startup_log(text)
    parse_ibv_devinfo(text)
    parse_rdma_link(text)
    parse_all_reduce_perf(text)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(read("nccl-error", "startup.log").splitlines() +
                                read("good", "startup.log").splitlines()), max_size=60))
def test_scan_of_shuffled_real_lines_never_raises(lines: list[str]) -> None:
    scan_startup_log("\n".join(lines)).summary()


# A request the lab vLLM 0.32.0 refused, verbatim from its log (the session lab server of a CI run, 2026-12-03):
# a client asked for a model it does not serve.
REFUSED_REQUEST = ("(APIServer pid=25858) ERROR 12-03 08:56:57 [serving.py:274] Error with model error=ErrorInfo("
                   "message='The model `no-such-model` does not exist. Valid aliases: tiny-agent.', "
                   "type='NotFoundError', param='model', code=404)")


def test_a_request_refused_after_ready_is_the_clients_error_not_a_startup_failure() -> None:
    """An attached server's log runs past its start: a 4xx it logged at ERROR after ready is listed apart and
    never makes the start a failure; the same line before ready still counts (nothing is assumed there)."""
    from pathlib import Path

    from vllm_acceptance.core.profile import load_profile
    from vllm_acceptance.rules.serve import check_startup_log

    repo = Path(__file__).resolve().parents[2]
    ready = (repo / "tests/fixtures/real/vllm/v1-0.32-cpu-lab-ready-one-line-kv.log").read_text()
    assert scan_startup_log(ready).failure_class() is None
    after = scan_startup_log(ready.rstrip("\n") + "\n" + REFUSED_REQUEST + "\n")
    assert after.ready and after.failure_class() is None and not after.error_lines
    assert len(after.request_errors) == 1 and "no-such-model" in after.request_errors[0].text
    assert "request_errors" in after.summary() and "no-such-model" in after.summary()["request_errors"][0]
    finding = check_startup_log(after, load_profile(repo / "profiles" / "cpu-lab.yml"), "localhost", [])
    assert finding.status.value != "fail", finding.reason
    before = scan_startup_log(REFUSED_REQUEST + "\n" + ready)
    assert before.failure_class() == "other" and not before.request_errors


def test_a_traceback_of_the_running_server_is_listed_not_a_startup_failure() -> None:
    """The lab vLLM's hermes tool parser logged a traceback on one reply long after it served (a real capture):
    an attached server's log or a re-check reads it as the running server's error, listed, never as a failed start;
    the same lines before the server bound its socket are a start that failed."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    ready = (repo / "tests/fixtures/real/vllm/v1-0.32-cpu-lab-ready-one-line-kv.log").read_text().rstrip("\n")
    parser = (repo / "tests/fixtures/serve/vllm-cpu-0.32-lab-hermes-parser-traceback-after-ready.log").read_text()
    after = scan_startup_log(ready + "\n" + parser)
    assert after.failure_class() is None and not after.error_lines and not after.traceback
    assert after.runtime_tracebacks == 1 and len(after.runtime_errors) == parser.count(" ERROR ")
    summary = after.summary()
    assert summary["runtime_tracebacks"] == 1 and summary["runtime_error_lines"] == len(after.runtime_errors)
    assert "Error in extracting tool call" in summary["runtime_errors"][0] and summary["failure_class"] is None
    cut = ready.split("\n")
    served = next(i for i, line in enumerate(cut) if "Application startup complete" in line)
    before = scan_startup_log("\n".join(cut[:served]) + "\n" + parser)
    assert before.failure_class() == "other" and before.traceback and not before.runtime_errors
