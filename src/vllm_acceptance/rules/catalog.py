"""The check catalog: every check id the product writes, registered once.

One entry per id: its family (the id's prefix), the stage that judges it, a title, the pass rule,
the consequence of a failure for the verdict, the evidence it reads and the source passage it
implements. `vllm-acceptance checks` lists it; `docs/checks.md` is generated from it
(`vllm-acceptance checks --format md > docs/checks.md`; a test fails when the file is stale).

Sources are named as in the README: the four source articles, cited by their anchors in
docs/sources.md (docs/sources.md#a000 and #a001 in Russian, #a003 in Chinese, #a004 in French), and
the official recipe of the profile.

Consequences: `rebuild_environment` (the environment is out of profile), `expand_capacity`,
`limited_observation` (a limit or a controlled mitigation), `block_agent_traffic` (the agent gate
closes; plain text may still open). A `missing` or `inconclusive` finding of any check makes the run
`incomplete` unless a failed compatibility chain already decides it.
"""

from __future__ import annotations

from .registry import register

REBUILD, EXPAND, LIMIT, AGENT = "rebuild_environment", "expand_capacity", "limited_observation", "block_agent_traffic"

# --- compatibility chain, per node (preflight) ---------------------------------------------------

register("compat.preflight", stage="preflight", consequence=REBUILD,
         title="Preflight ran and left findings",
         rule="the preflight stage wrote findings/preflight.json for this run",
         evidence="findings/preflight.json",
         source="docs/sources.md#a004: fix the compatibility chain before any functional test")
register("compat.gpu_nodes", stage="preflight", consequence=REBUILD,
         title="GPU nodes named in the inventory",
         rule="a GPU profile needs at least one host in the inventory's gpu_nodes group; without one no driver, "
              "CUDA, GPU visibility or Fabric Manager evidence exists",
         evidence="the inventory's gpu_nodes group (run.json hosts)",
         source="README 'Pointing it at a real cluster': gpu_nodes lists every GPU node")
register("compat.recipe_record", stage="preflight", consequence=LIMIT,
         title="Recipe recorded and recently re-checked",
         rule="recipe source, status and check date recorded; a pre-release recipe re-checked within "
              "review.period_days",
         evidence="evidence/profile.yml (the run's frozen profile)",
         source="docs/sources.md#a000, #a001: recipe source, its status (pre-release / stable) and the date it was "
                "checked")
register("compat.driver_branch", stage="preflight", consequence=REBUILD,
         title="Host driver branch and version",
         rule="driver branch >= profile driver.min_branch and version >= driver.min_version, the same version in "
              "every source (kernel module /proc, NVML via nvidia-smi, inside the container)",
         evidence="/proc/driver/nvidia/version, nvidia-smi -q -x, nvidia-smi --query-gpu, in-image probe",
         source="docs/sources.md#a001: CUDA 13.0 GA needs Linux driver >= 580.65.06; R575 belongs to the CUDA 12.x "
                "line")
register("compat.driver_module", stage="preflight", consequence=REBUILD,
         title="NVIDIA kernel module loaded",
         rule="kernel module `nvidia` loaded",
         evidence="lsmod",
         source="docs/sources.md#a001: kernel module loaded, the same driver seen from inside the container")
register("compat.container_cuda", stage="preflight", consequence=REBUILD,
         title="CUDA runtime inside the actual image",
         rule="CUDA major of the runtime inside the image == profile image.cuda_major (torch.version.cuda, "
              "/usr/local/cuda/version.json, libcudart soname) - never nvidia-smi's 'CUDA Version' line",
         evidence="in-image probe (docker/podman run of the image), image inspect",
         source="docs/sources.md#a001: the CUDA runtime inside the actual container, not the 'CUDA Version' line of "
                "nvidia-smi")
register("compat.image_identity", stage="preflight", consequence=REBUILD,
         title="Image reference and digest",
         rule="the image's content is the profile's own image: its RepoDigests carry the digest the profile pins, "
              "under whichever registry's name (a mirror or proxy serving the very same manifest is the official "
              "image; observed names it, pulled_as), else (no pinned digest) a RepoDigest under the profile's "
              "repository with its tag; names normalised as docker/distribution and podman do (docker.io, "
              "library/, index.docker.io, podman short names); another image than the profile's, whatever inventory "
              "variable names it (an inventory pin never stands for the profile's), fails with limited observation "
              "at most, the run judged on the experimental route (never a release of the profile); no forbidden "
              "tag suffix (e.g. -cu129), the configured name pulled from its own repository (not a retag) and the "
              "digest the profile or inventory pins present: else fail; no RepoDigest (docker load, a local build) "
              "or another registry with no pinned digest to compare: inconclusive, naming how to prove it (pull by "
              "digest, or compare the image ID with the official config digest), never a rebuild, never a pass; "
              "attached to a running server: the container of the process on its port (/proc/PID/cgroup) runs the "
              "judged image ID (docker/podman inspect --type container; a Kubernetes pod: crictl inspect, its "
              "image ID, or its repo digest compared with the judged image's RepoDigests, stated not comparable "
              "when it has none), another image fails; a server on the node that runs in no container fails "
              "(the judged image is not what serves); one whose container's image cannot be read is inconclusive",
         evidence="docker/podman image inspect (a containerd/CRI-O node without them: crictl inspecti); attached: "
                  "live_process (container id, its image ID)",
         source="docs/sources.md#a000, #a001: image identity: full reference and digest, pull date, the exact launch "
                "command; #image-reference: name normalisation, RepoDigests, what a load or a mirror leaves")
register("compat.image_uniform", stage="preflight", consequence=REBUILD,
         title="One image on every GPU node",
         rule="one image on every containerised GPU node of the run: the image the node's vLLM container runs "
              "(attached: the server, a multi-node worker's headless vLLM) where it was read, else the configured "
              "image as the node inspected it; compared on content: equal image IDs (sha256: or bare hex), or one "
              "node's ID a manifest digest the other was pulled by (docker's containerd image store reports the "
              "manifest digest as the ID), on the same architecture; a server whose process this user cannot see "
              "(ss shows no pid): inconclusive, never the configured image in its place",
         evidence="image inspect of every node; attached: live_process (the serving or headless container's image)",
         source="docs/sources.md#a001: one run judges one image; a re-pulled moving tag is another image; "
                "#image-reference: image ID and manifest digest per image store")
register("compat.vllm_version", stage="preflight", consequence=REBUILD,
         title="vLLM version and install source",
         rule="vLLM in the actual runtime >= profile vllm.min_version",
         evidence="in-image probe (vllm.__version__, install source)",
         source="recipe: min_vllm_version; docs/sources.md#a001: vLLM install source and version saved")
register("compat.launch_args", stage="preflight", consequence=REBUILD,
         title="Every node's command accepted by the image's own vLLM",
         rule="inside the image on the head node (the process runtime: its Python), vLLM's own argument checks accept "
              "every node's `vllm serve` command as the launch builds it: its parser, validate_parsed_serve_args, "
              "ServeSubcommand.cmd's load-balancing and headless logic, the chosen launcher's checks and "
              "EngineArgs.from_cli_args (serve/vllm_argcheck.py; create_engine_config, which needs the model's files, "
              "is judged by the launch itself); a refusal fails with vLLM's message as a configuration error; a check "
              "that could not run or left a node unjudged is inconclusive, no answer from the head is missing; "
              "attached or no vllm_head: not applicable",
         evidence="launch_args_check on the head node (docker|podman run --rm --gpus all --entrypoint python3 IMAGE "
                  "-c <vllm_argcheck.py> JSON)",
         source="vllm/entrypoints/cli/serve.py, vllm/entrypoints/launchers/cli_args.py, vllm/engine/arg_utils.py "
                "(docs/sources.md#vllm-argument-checks): the version that runs is the authority")
register("compat.gpu_visibility", stage="preflight", consequence=REBUILD,
         title="GPUs visible to host and runtime",
         rule="host and runtime each see at least the GPUs the launched layout needs on this node (with "
              "hardware.class: the hardware table's GPUs per node, and the node's CPU architecture is the class's), "
              "of the profile's GPU class",
         evidence="nvidia-smi --query-gpu / -q -x, in-image probe (torch.cuda.device_count)",
         source="docs/sources.md#a001: the runtime sees every GPU that tensor/pipeline/expert parallel needs")
register("compat.topology", stage="preflight", consequence=REBUILD,
         title="Node count and GPU total",
         rule="nodes >= hardware.min_nodes and GPUs in total >= the launched layout (tensor x pipeline x data); "
              "with hardware.class: nodes >= the layout over the table's GPUs per node, and a tensor-parallel group "
              "wider than a node fits one multi-node NVLink domain",
         evidence="every node's GPU list",
         source="recipe: the 8 x GB300 minimum is a reference point confirmed on the actual hardware")
register("compat.fabric_manager", stage="preflight", consequence=REBUILD,
         title="Fabric Manager on NVSwitch systems",
         rule="where Fabric Manager runs on the node (hardware.fabric_manager node, or hardware.nvswitch without it): "
              "nvidia-fabricmanager active, its version == the driver version, GPU fabric state Completed/Success; "
              "on NVL72 trays whose switch trays run it, not applicable (interconnect.fabric_state is the proof)",
         evidence="systemctl is-active nvidia-fabricmanager, nv-fabricmanager --version, nvidia-smi -q -x <fabric>",
         source="docs/sources.md#a000, #a001: NVSwitch systems: Fabric Manager active, its version equal to the "
                "driver's")
register("compat.peermem", stage="preflight", consequence=REBUILD,
         title="GPU peer memory module on the DMA-BUF fallback (multi-node RDMA)",
         rule="nvidia_peermem (or the older nv_peer_mem) loaded where the launch crosses nodes over RDMA with the "
              "recipe's DMA-BUF fallback (NCCL_DMABUF_ENABLE=0 in the launch's environment); not applicable over "
              "DMA-BUF (NCCL's default) or where the launch's interconnect is the NVLink fabric (MNNVL trays: the "
              "TP group never crosses RDMA)",
         evidence="lsmod, the launch's interconnect and environment (inventory, live process)",
         source="docs/sources.md#a001: multi-node: RDMA devices, nvidia_peermem (or the older nv_peer_mem); recipe: "
                "NCCL_DMABUF_ENABLE=0 falls back to nvidia_peermem")
register("compat.known_defects", stage="preflight", consequence=LIMIT,
         title="No component version with a published defect for this model",
         rule="the NCCL version read inside the image (in-image probe torch.cuda.nccl.version(), the in-image "
              "all-reduce, NCCL's 'NCCL version' INFO line) is not one that src/vllm_acceptance/data/known_defects.yml "
              "lists with its source (a listed version: a warning naming the defect, its source and fix); no "
              "version read: inconclusive",
         evidence="in-image probe, in-image all-reduce output, src/vllm_acceptance/data/known_defects.yml",
         source="docs/sources.md#known-defects: NVIDIA/nccl#2167 and the threads that name affected versions")
register("compat.state_snapshot", stage="preflight", consequence=REBUILD,
         title="State snapshot saved before any change",
         rule="every snapshot command of source 001 that applies was captured (date -u, hostname, uname -a, "
              "nvidia-smi, docker version/info/image inspect, env | sort redacted, lsmod; a containerd/CRI-O node "
              "without docker/podman: crictl version/info/inspecti)",
         evidence="evidence/nodes/<host>/*",
         source="docs/sources.md#a001: save the state first, change nothing")

register("compat.server_location", stage="preflight", consequence=REBUILD,
         title="The attached server runs on a judged GPU node",
         rule="attach mode: a process listens on vllm_base_url's port (preflight_live_port) on the gpu_nodes host "
              "that the URL's host is (the controller's resolution of it is one of that node's own addresses; a "
              "loopback URL only where the controller shares the node's network namespace), seen with its pid (ss "
              "-ltnpH, else the pid or container named for vllm_head), on an address the URL reaches (a socket "
              "bound to loopback serves only a loopback URL); a listener whose pid this user cannot see, a URL host "
              "that is no judged node (a load balancer), an unresolved host, or no judged node listening: "
              "inconclusive (never a release); a node without an answer and none found: missing; launch mode: not "
              "applicable",
         evidence="evidence/nodes/<host>/live_process.txt (ss -ltnpH lines on the port, pid, /proc/PID, the node's "
                  "addresses), evidence/preflight-url.json (the URL host's resolution on the controller)",
         source="docs/sources.md#a000, #a001: the acceptance judges the environment the server actually runs in (issue "
                "28 item 3)")

# --- interconnect (preflight) --------------------------------------------------------------------

register("interconnect.rdma", stage="preflight", consequence=REBUILD,
         title="RDMA ports up (multi-node)",
         rule="at least one RDMA port ACTIVE on every multi-node GPU node where the launch's interconnect is rdma "
              "(the inventory's vllm_interconnect over the profile's hardware.interconnect)",
         evidence="ibv_devinfo, rdma link",
         source="docs/sources.md#a001: multi-node: RDMA devices")
register("interconnect.nccl_env", stage="preflight", consequence=REBUILD,
         title="Interconnect settings of the launch",
         rule="the recipe's multi-node args/env for this interconnect are in the launched plan (all2all backend, "
              "UCX_TLS, NCCL_*); NCCL_DMABUF_ENABLE=0 only when a startup log shows the mlx5dv_reg_dmabuf_mr error; "
              "attached: judged on the running server, inconclusive where its process or environment is not "
              "visible to this user (never on the plan)",
         evidence="the launched command and environment, node env, startup logs",
         source="recipe: multi-node settings; docs/sources.md#a001: NCCL_DMABUF_ENABLE=0 only on the logged "
                "mlx5dv_reg_dmabuf_mr error")
register("interconnect.nccl_bandwidth", stage="preflight", consequence=EXPAND,
         title="NCCL all-reduce bandwidth between nodes",
         rule="all-reduce bus bandwidth >= the hardware table's fail threshold for the fabric it crossed (warn "
              "below its warn threshold), read for the shape measured: a run whose largest message is below the "
              "figure's published size is judged against the bounds scaled by the fabric's published size curve, "
              "and where no figure is published for the measured GPU count or size the band between the fail and "
              "warn bounds is inconclusive (never a warn, never a pass); else >= profile "
              "thresholds.nccl_busbw_gbps, over the profile's collective "
              "backend (hardware.collective_backend, default nccl), no wrong results, ranks on >= 2 nodes when "
              "multi-node; measured by all_reduce_perf, or where it is absent by torch.distributed inside the "
              "image under test on every node at once",
         evidence="all_reduce_perf output, or the in-image all-reduce's JSON (roles/preflight/files/allreduce.py)",
         source="docs/sources.md#a001: an NCCL bandwidth test between nodes")
register("interconnect.fabric_state", stage="preflight", consequence=REBUILD,
         title="Every GPU joined the multi-node NVLink fabric (NVL72 trays)",
         rule="on MNNVL hardware (hardware.nvlink_domain or the hardware table's class): every GPU's fabric State "
              "Completed, Status Success, bandwidth health Full, and a ClusterUUID that is not all zeros or N/A "
              "(zeros: the fabric never initialised on this tray); the health Summary Healthy where reported (not "
              "Unhealthy or Limited Capacity), no Route Unhealthy, Route Recovery or Access Timeout Recovery, "
              "Incorrect Configuration None",
         evidence="nvidia-smi -q -x <fabric> (state, status, cliqueId, clusterUuid, health: summary, bandwidth, "
                  "route_unhealthy, route_recovery_in_progress, access_timeout_recovery, incorrect_configuration)",
         source="docs/sources.md#nvlink-domain: NVIDIA IMEX guide and nvidia-smi -q fabric fields; SPEC 'Hardware "
                "the recipe verifies'")
register("interconnect.nvlink_domain", stage="preflight", consequence=REBUILD,
         title="The trays of one NVLink-joined group share one NVLink domain and partition",
         rule="every GPU of every tray in the group reports the same ClusterUUID (one NVLink domain, one rack) and "
              "the same CliqueId (one NVLink partition); a tray outside is named",
         evidence="every tray's nvidia-smi -q -x <fabric>",
         source="docs/sources.md#nvlink-domain: a TP group across trays needs one NVLink domain and partition")
register("interconnect.imex", stage="preflight", consequence=REBUILD, warn_blocks=False,
         title="IMEX service and domain on every tray of the group",
         rule="the nvidia-imex service active on every tray; nvidia-imex-ctl -N: every tray of the group (the trays "
              "the launch uses, by preflight_imex_address) READY and connected (C) to the others, its node list "
              "holding every tray of the group (else the same node list on every tray), Domain State UP; a node "
              "outside the group not READY (or its links, or a domain DEGRADED by it alone): a warning naming it "
              "that does not block release",
         evidence="systemctl is-active nvidia-imex, nvidia-imex-ctl -N",
         source="docs/sources.md#nvlink-domain: cross-node GPU memory needs the IMEX service and a domain with "
                "every node READY")
register("interconnect.imex_channel", stage="preflight", consequence=REBUILD,
         title="An IMEX channel inside the container (multi-node NVLink)",
         rule="on MNNVL hardware with several trays: the in-image probe, started with the launch's request "
              "(docker NVIDIA_IMEX_CHANNELS=0, podman the channel's device node), lists at least one channel in "
              "/dev/nvidia-caps-imex-channels inside the container; none inside fails, naming the fix (request it, "
              "or the site's toolkit ignores requests, or no channel on the host: ls of the host's directory); the "
              "environment is never the proof; a process runtime: the host's channels",
         evidence="in-image probe (imex_channels), ls -1 /dev/nvidia-caps-imex-channels on the host",
         source="docs/sources.md#imex-channel: the NVIDIA container toolkit injects IMEX channels only on request "
                "(NVIDIA/libnvidia-container#242, NVIDIA/nvidia-container-toolkit#952); SPEC 'Multi-node NVLink "
                "inside a container'")
register("interconnect.fabric_path", stage="preflight", consequence=REBUILD,
         title="The all-reduce crossed the fabric the layout expects",
         rule="within one NVLink domain (MNNVL hardware, several trays) NCCL's INFO log shows MNNVL enabled and "
              "channels via P2P/MNNVL, none via NET (an InfiniBand fallback inside a rack fails); no INFO lines: "
              "inconclusive",
         evidence="all_reduce_perf or the in-image all-reduce run with NCCL_DEBUG=INFO (MNNVL, P2P/MNNVL, NET/IB, "
                  "NVLS lines; NCCL_MNNVL_ENABLE)",
         source="docs/sources.md#nccl-fabric-lines: NCCL's own INFO format strings")

# --- serve: launch or attach ---------------------------------------------------------------------

register("interconnect.allreduce_path", stage="serve", consequence=REBUILD, warn_blocks=False,
         title="The all-reduce path vLLM and NCCL chose matches the launch's interconnect",
         rule="where the tensor-parallel group crosses nodes: the startup log shows no FlashInfer MNNVL all-reduce "
              "workspace (or its failure) unless the nodes share one NVLink domain, and NCCL's INFO channel lines "
              "cross the launch's interconnect (P2P/MNNVL over nvl; not NET/Socket over rdma); a log naming no path "
              "is a warning that does not block release (never a pass)",
         evidence="evidence/serve/startup.log (vLLM flashinfer_all_reduce.py lines, NCCL INFO lines)",
         source="docs/sources.md#known-defects: vLLM's MNNVL all-reduce on IB-only nodes hangs "
                "(vllm-project/vllm#51986)")

register("compat.serve", stage="serve", consequence=REBUILD,
         title="Serve stage ran",
         rule="the serve stage wrote findings/serve.json (the server was launched or attached and judged)",
         evidence="findings/serve.json, evidence/serve/*",
         source="docs/sources.md#a004: the runtime before measuring performance")
register("compat.startup_log", stage="serve", consequence=REBUILD,
         title="Startup log against the recipe",
         rule="version >= profile minimum, recipe options in effect, no backend fallback, no NCCL/CUDA-driver "
              "errors, world size == the launched layout, KV cache initialised; every warning listed; a log holding "
              "several starts (a journal across Restart=) is judged on its last start",
         evidence="evidence/serve/startup.log",
         source="docs/sources.md#a000, #a001: the first lines of the startup log compared with the recipe")
register("compat.startup_log_identity", stage="serve", consequence=REBUILD,
         title="An operator-named startup log is the running server's",
         rule="attach mode, a log from vllm_serve_startup_log or vllm_serve_attach_log_command: the vLLM version it "
              "states == the server's /version, and where it states them, its GPU blocks == vllm:cache_config_info "
              "num_gpu_blocks and its max_model_len (engine config max_seq_len, else non-default args) == /v1/models; "
              "and its non-default args are the running process's argv (vllm_serve_pid's /proc/PID/cmdline: a flag "
              "with another value, or logged but not passed, is a difference naming both sides); "
              "a difference, no version on either side, or no argv read: inconclusive and the log is not used "
              "(compat.startup_log is then missing); launch mode: the run captured the log itself",
         evidence="evidence/serve/startup.log (used) or evidence/serve/startup-log-rejected.log, /version, "
                  "evidence/serve/v1-models.json, evidence/serve/metrics-at-ready.prom",
         source="docs/sources.md#a000, #a001: the startup log of the server under test, compared with the recipe "
                "(issue 28 item 3)")
register("compat.actual_config", stage="serve", consequence=REBUILD,
         title="Actual configuration readable",
         rule="the running server's configuration could be read (/metrics, /v1/models)",
         evidence="evidence/serve/metrics.prom, evidence/serve/models.json",
         source="docs/sources.md#a000: actual configuration, not the command line")
register("compat.actual_config.prefix_caching", stage="serve", consequence=REBUILD,
         title="Prefix caching as the running server reports it",
         rule="vllm:cache_config_info enable_prefix_caching == the profile's expectation",
         evidence="evidence/serve/metrics.prom",
         source="docs/sources.md#a000, #a004: prefix caching on per vllm:cache_config_info")
register("compat.actual_config.cache", stage="serve", consequence=REBUILD,
         title="KV-cache flags as the running server reports them",
         rule="every recipe flag that vllm:cache_config_info reports (--kv-cache-dtype as cache_dtype, --block-size, "
              "--gpu-memory-utilization, ...) has the requested value there; a label that is absent or shows "
              "another value is a finding, never a pass",
         evidence="evidence/serve/metrics-at-ready.prom (vllm:cache_config_info labels)",
         source="docs/sources.md#a000: actual configuration, not the command line")
register("compat.actual_config.flags", stage="serve", consequence=REBUILD,
         title="Recipe flags in effect on the running server",
         rule="every other recipe flag (required flags and the profile's parsers included) shows the requested value "
              "in the server's own startup record (non-default args: reprs such as AttentionConfig(...) compared "
              "field by field); a flag at that vLLM version's default is absent there and is read from the engine "
              "config line (\"Initializing ... LLM engine ... with config\"); a value shown differently in any source "
              "fails, a flag no source shows or an unreadable line is inconclusive with the line quoted, never a "
              "fail for its absence alone; the argv is kept as what was asked, never as the proof",
         evidence="evidence/serve/startup.log (non-default args, engine config), evidence/serve/process-args.json",
         source="docs/sources.md#a000: parsers and flags from the running process")
register("compat.actual_config.unlisted_args", stage="serve", consequence=REBUILD,
         title="Every non-default argument of the running server",
         rule="the startup log's non-default args that the profile does not list are recorded; a capacity-limiting "
              "one the profile does not state (max_num_seqs x the engines that serve below the contract's "
              "concurrency, max_num_batched_tokens below vLLM's default for the hardware or, without chunked "
              "prefill, below one contracted request, enforce_eager, speculative_config, kv_transfer_config, KV or "
              "weight offload, max_model_len below the contract) fails; per-engine arguments count once per engine "
              "the server shows (its startup log's data_parallel_size, the engine labels of /metrics: the fewer); an "
              "absent startup log is missing, an unreadable line inconclusive; the inventory's vllm_serve_extra_args "
              "and preflight_launch_args adding one are refused at validation (engines: the launch's data-parallel "
              "size)",
         evidence="evidence/serve/startup.log (non-default args), evidence/serve/metrics-at-ready.prom (engines)",
         source="docs/sources.md#a000: actual configuration, not the command line (every argument the server runs "
                "with)")
register("compat.actual_config.max_model_len", stage="serve", consequence=REBUILD,
         title="Context limit the server serves",
         rule="/v1/models max_model_len >= the contract (context_tokens + max_output_tokens); its difference from "
              "the recipe's --max-model-len is recorded, never failed (the recipe adjusts it per scenario); a profile "
              "whose contract exceeds what its launch serves is refused at validation",
         evidence="evidence/serve/models.json",
         source="docs/sources.md#a000: max_model_len from /v1/models")
register("compat.served_model", stage="serve", consequence=REBUILD,
         title="The model that serves is the profile's model",
         rule="the weights the running server loaded are the profile's: every /v1/models card's root names model.path "
              "or model.name (the same path, its last components, or the hub cache's snapshot of the id) and is no "
              "adapter, the profile's model.served_name is among its ids, the startup log's model is the same, and its "
              "non-default args hold no identity argument the profile's launch.args do not state (served_model_name "
              "without the profile's name, revision, code/tokenizer revision, tokenizer, hf_config_path, hf_overrides, "
              "quantization, quantization_config, dtype, chat_template, override_generation_config, generation_config, "
              "lora_modules, load_format dummy; the recipe serves its checkpoint as shipped) and none the profile "
              "states shown with another value; any difference fails naming both values; no /v1/models or no "
              "startup log is missing, a card without root or an unreadable "
              "non-default args line inconclusive; the checkpoint's config.json hash is recorded where this machine "
              "reads it; the same arguments in vllm_serve_extra_args or preflight_launch_args, and a "
              "vllm_serve_model_path / vllm_serve_served_name naming another model, are refused at validation",
         evidence="evidence/serve/v1-models.json (id, root, parent), evidence/serve/startup.log (non-default args, "
                  "engine config)",
         source="docs/sources.md#served-model-identity, #a000: the model that serves is the accepted one "
                "(issue 42 item 1)")
register("capacity.model_load", stage="serve", consequence=EXPAND,
         title="Model load",
         rule="the server answers /health after loading the model, within launch.ready_timeout_s",
         evidence="startup log, readiness timings",
         source="docs/sources.md#a000: stage 1, model load: time to ready, weight-load time, peak memory per GPU")

# --- launch failures (docs/sources.md#a001, "when vLLM does not start") --------------------------

register("compat.launch_evidence", stage="launch", consequence=REBUILD,
         title="State saved before any retry",
         rule="image tag and digest, vLLM install source and version, nvidia-smi, and the full startup log "
              "from its first line to the exit were saved",
         evidence="evidence/serve/*, evidence/nodes/<host>/*",
         source="docs/sources.md#a001: save the state first, change nothing")
register("compat.launch_triage", stage="launch", consequence=REBUILD,
         title="Why vLLM did not start",
         rule="the startup log matches a known failure signature; environment (CUDA chain before the model "
              "loads) -> rebuild; configuration -> fix the flag; no flag tuning for environment errors",
         evidence="evidence/serve/startup.log, preflight findings",
         source="docs/sources.md#a001: when vLLM does not start")
register("capacity.launch_triage", stage="launch", consequence=EXPAND,
         title="vLLM did not start: capacity",
         rule="a launch that died after memory allocation (OOM, KV cache too small) is a capacity finding",
         evidence="evidence/serve/startup.log",
         source="docs/sources.md#a001: CUDA initialises, the model loads, the process dies after memory allocation")

# --- prefix-cache reuse --------------------------------------------------------------------------

register("cache.probe", stage="cache", consequence=REBUILD,
         title="Cache probe ran",
         rule="the cache probe ran to its end and wrote its result",
         evidence="findings/cache.json, stages/cache.json",
         source="docs/sources.md#a004: prefix-cache reuse measured, not assumed")
register("cache.reuse", stage="cache", consequence=REBUILD,
         title="Prefix cache reused on an identical prefix",
         rule="hot requests hit the shared prefix in every session; no reuse -> do not count the gain, rework "
              "configuration and protocol (rebuild_environment when the profile's capacity relies on reuse, "
              "else limited_observation)",
         evidence="probes/cache/*",
         source="docs/sources.md#a004: no reuse on an identical prefix: rework configuration and protocol")
register("cache.config", stage="cache", consequence=REBUILD,
         title="Prefix caching on per the server",
         rule="enable_prefix_caching label of vllm:cache_config_info is True",
         evidence="probes/cache/metrics-*.prom",
         source="docs/sources.md#a000: prefix caching on per vllm:cache_config_info")
register("cache.metrics", stage="cache", consequence=REBUILD,
         title="Cache counters readable",
         rule="every counter of the protocol is exported and readable (prefix_cache_queries/hits, "
              "prompt_tokens_cached, request_prefill_kv_computed_tokens, request_prefill_time_seconds)",
         evidence="probes/cache/metrics-*.prom",
         source="docs/sources.md#a004: per-request deltas from the right instance")
register("cache.isolation", stage="cache", consequence=REBUILD,
         title="Each cache request measured alone",
         rule="the server is idle before and after each request and its request counter moves by exactly one",
         evidence="probes/cache/*",
         source="docs/sources.md#a004: isolate the instance first, no other traffic during the probe")
register("cache.cold_baseline", stage="cache", consequence=REBUILD,
         title="Cold requests do not hit",
         rule="a cold request's hits stay within the template head every request shares (+ one block)",
         evidence="probes/cache/*",
         source="docs/sources.md#a004: cold queries rise and hits stay near zero")
register("cache.hot_reuse", stage="cache", consequence=REBUILD,
         title="Hot requests hit the shared prefix",
         rule="hot hits == the block-aligned shared prefix (hybrid models: step-shaped, above the template head)",
         evidence="probes/cache/*, /tokenize answers",
         source="docs/sources.md#a004: hot hits near the shared-prefix length (block granularity)")
register("cache.repeat_rounds", stage="cache", consequence=REBUILD,
         title="Repeated rounds on one hot prefix keep hitting",
         rule="the same hot request re-sent over cache.rounds rounds hits the shared prefix (hybrid: from the "
              "second round, within one retention step, above the template head); a round is judged only where "
              "the engine's KV cache (num_gpu_blocks) holds every block the probe sent since that prefix, none "
              "left to judge: inconclusive",
         evidence="probes/cache/requests.json",
         source="docs/sources.md#a004, #prefix-cache-eviction: repeat over several sessions; hybrid models: the first "
                "repeat may only create the retention; vLLM's LRU eviction of cached blocks",
         notes="a round is judged only where the engine's KV cache (num_gpu_blocks of vllm:cache_config_info, less "
               "the null block) holds every block the probe's own requests needed since its prefix was last sent: "
               "vLLM frees cached blocks to the end of its free queue and takes new ones from the front "
               "(vllm/v1/core/block_pool.py free_blocks), so beyond that the protocol itself may have evicted the "
               "prefix; no round left to judge is inconclusive, never pass")
register("cache.restart", stage="cache", consequence=REBUILD,
         title="Hot again after a restart",
         rule="after a restart (process start time moved) the hot request's local hits are near zero; hits from "
              "an external KV connector are reported as external; in accept.yml the server the run launched is "
              "restarted between two probe calls (acceptance_cache_restart), an attached one never",
         evidence="probes/cache/requests.json or restart-requests.json, restart.log",
         source="docs/sources.md#a001: the hot request again after a server restart shows the cache source")
register("cache.control", stage="cache", consequence=REBUILD,
         title="A changed prefix drops back",
         rule="the control request (a key field changed near the start) hits no more than the cold baseline",
         evidence="probes/cache/*",
         source="docs/sources.md#a004: the control drops back")
register("cache.prefill_gain", stage="cache", consequence=REBUILD,
         title="Prefill work drops with the hits",
         rule="per prompt token, new computed prefill tokens and prefill time drop with the hits; counters without "
              "a latency change (or the reverse) are inconclusive; no hits, no less work and a time drop under 10 % "
              "fail",
         evidence="probes/cache/*",
         source="docs/sources.md#a004: counters that rise without a matching latency change are inconclusive")
register("cache.source", stage="cache", consequence=REBUILD,
         title="Cache source told apart",
         rule=("hits from the device/host tier; vllm:prompt_tokens_cached = local + external hits; the tiers "
              "account for the local hits; external_prefix_cache_* never pass for local reuse"),
         evidence="probes/cache/metrics-*.prom (prompt_tokens_by_source, external_prefix_cache_*)",
         source="docs/sources.md#a001, #a004: the cache source is told apart")
register("cache.engines", stage="cache", consequence=REBUILD,
         title="Every engine of a data-parallel server reuses its own prefix",
         rule="a server with several engines (data parallel, DEP: the engine label of its series) has the protocol "
              "run on each, every session pinned to one engine with vLLM's X-data-parallel-rank header; each "
              "engine's clean hot requests, served by that engine (its counters moved), hit the prefix it served "
              "before; an engine failing is named; one without a clean measurement of its own (a proxy dropping "
              "the header, other traffic) is inconclusive; one engine: not applicable",
         evidence="probes/cache/requests.json (engine, served_by per request), probes/cache/metrics/*.prom",
         source="docs/sources.md#vllm-data-parallel: each engine has its own cache; the API server balances "
                "between engines unless a request names its rank")
register("cache.timeouts", stage="cache", consequence=REBUILD,
         title="Hung cache requests",
         rule="a request without a complete answer within cache.request_timeout_s decides nothing; it is named",
         evidence="probes/cache/*",
         source="docs/sources.md#a003: hung requests are a defect to name, never a pass")
register("cache.crash", stage="cache", consequence=REBUILD,
         title="Server died during the cache probe",
         rule="the protocol runs to its end on one live instance",
         evidence="probes/cache/crash_record.json, server log tail",
         source="docs/sources.md#a001: save the state first")

# --- agent interface -----------------------------------------------------------------------------

register("agent.probe", stage="agent", consequence=AGENT,
         title="Agent probe ran",
         rule="the agent probe ran to its end and wrote its result",
         evidence="findings/agent.json, stages/agent.json",
         source="docs/sources.md#a003: agent interface conformance")
register("agent.tool_schemas", stage="agent", consequence=AGENT,
         title="Tool schemas valid",
         rule="tool JSON Schemas validated before any request is sent",
         evidence="the scenario pack",
         source="docs/sources.md#a003: tool JSON Schemas validated before any request")
register("agent.tool_call", stage="agent", consequence=AGENT,
         title="Required tool call well-formed",
         rule=("over the seeded case set's distinct cases (scenarios/cases.py: single, parallel, multi-turn; "
              "agent.cases, at least what the threshold needs, agent.turn_budget at most): tool_calls present, "
              "names from the schema, arguments valid JSON per schema; the format-error rate's 95 % upper bound "
              "<= thresholds.tool_format_error_rate; below it only with every error recovered by the validated retry"),
         evidence="probes/agent/<case>/*",
         source="docs/sources.md#a003, recipe: K3 occasionally emits a tool-call format its parser does not expect")
register("agent.schema_accuracy", stage="agent", consequence=AGENT,
         title="Schema accuracy resolves its minimum",
         rule="valid calls / calls with finish_reason tool_calls; its 95 % lower bound >= "
              "thresholds.schema_accuracy_min",
         evidence="probes/agent/turns.json",
         source="recipe: Kimi Vendor Verifier schema accuracy; docs/sources.md#a003: rates of schema-valid calls")
register("agent.trigger_consistency", stage="agent", consequence=AGENT,
         title="Consistent tool triggering",
         rule=("repeated runs of the same case trigger the same call structure: tools, argument keys, enum / id / "
              "boolean values (agent.consistency_cases x agent.repeats; repeats never enter a rate); free text and "
              "numbers that differ are reported, not failed (vLLM is not batch-invariant by default, "
              "docs/sources.md#vllm-batch-invariance); the irrelevance cases (no tool fits) abstain: the 95 % lower "
              "bound of abstentions >= thresholds.tool_abstain_min"),
         evidence="probes/agent/<case>/*",
         source="docs/sources.md#a003: repeated runs: rates of schema-valid calls and of consistent triggering")
register("agent.separation", stage="agent", consequence=AGENT,
         title="Content, reasoning and tool calls apart",
         rule="no reasoning in content, no tool-call markup left in content",
         evidence="probes/agent/<case>/*",
         source="docs/sources.md#a003: content, reasoning output and tool_calls separated")
register("agent.stream_consistency", stage="agent", consequence=AGENT,
         title="Streaming and non-streaming agree",
         rule=("the assembled stream carries the non-streamed reply's tool calls (with a reasoning parser: its "
              "reasoning and content too)"),
         evidence="probes/agent/<case>/*",
         source="docs/sources.md#a003: streaming and non-streaming give the same structure")
register("agent.stream_structure", stage="agent", consequence=AGENT,
         title="Streamed tool-call deltas consistent",
         rule="every tool-call delta names its index; indexes start at 0 and rise by one; id and name arrive once "
              "and never change",
         evidence="probes/agent/cases/*-stream-streamed.json (raw stream)",
         source="docs/sources.md#a003: the call index consistent; streaming and non-streaming give the same structure")
register("agent.stream_tool_calls", stage="agent", consequence=AGENT,
         title="Streamed tool calls whole in every pass",
         rule=("the case set's call cases (agent.stream_cases; default every one) sent streamed beside their "
              "non-streamed send, the same request, alone (agent.concurrency) and in the under-load pass "
              "(agent.under_load, streamed and non-streamed mixed): a stream whose non-streamed twin calls a tool "
              "carries those calls whole; empty or partial tool_calls (a call lost, no name, arguments cut) fail, "
              "on the parser, or on the gateway when the direct server (--direct-url) streams the same pass whole "
              "at the same concurrency; without a direct server the attribution is stated open; argument values "
              "are not compared"),
         evidence="probes/agent/stream-twins.json, cases/*-stream-twin-*.json (raw streams), "
                  "stream-twins-direct-*.json",
         source="vllm-project/vllm#54701 (kimi_k2 streamed tool_calls empty under concurrent load), vllm#53246 (K3 "
                "streaming empty tool calls on 0.28.0), sgl-project/sglang#34604 (kimi_k3 parser failures in "
                "production) (docs/sources.md#stream-under-load)")
register("agent.multi_turn", stage="agent", consequence=AGENT,
         title="Multi-turn order kept",
         rule="user -> assistant tool call -> tool result -> assistant, roles and order kept",
         evidence="probes/agent/<case>/*",
         source="docs/sources.md#a003: multi-turn")
register("agent.tool_failure_fallback", stage="agent", consequence=AGENT,
         title="Failed tool result leads to the fallback",
         rule=("the deployment's answers to a failed tool result follow the scenario pack's fallback plan "
              "(retry of the same call, a schema-valid ticket, a user-facing answer that states no missing data)"),
         evidence="probes/agent/<case>/*",
         source="docs/sources.md#a003: a failed or incomplete tool result leads to the planned fallback")
register("agent.structured_output", stage="agent", consequence=AGENT,
         title="Structured output validated",
         rule=("a response_format json_schema answer validates; a real broken body from the server (cut by "
              "max_tokens) is rejected by the client validation and carries finish_reason length; raw bodies kept"),
         evidence="probes/agent/<case>/*",
         source="docs/sources.md#a003: structured output")
register("agent.executor_safety", stage="agent", consequence=AGENT,
         title="Safe failure and idempotent retry",
         rule=("every tool call the deployment returned goes through the reference client: validated, then "
              "executed or refused predictably; a write delivered twice, or one operation re-sent, runs once per key"),
         evidence="probes/agent/*",
         source="docs/sources.md#a003: safe failure; a retry of a write carries a request id")
register("agent.gateway", stage="agent", consequence=AGENT,
         title="Gateway keeps the answer",
         rule="direct and gateway responses have the same fields and types",
         evidence="probes/agent/<case>/direct-*, gateway-*",
         source="docs/sources.md#a003: attribute every defect to a layer (gateway: direct vs through the gateway "
                "differ)")
register("agent.client_library", stage="agent", consequence=AGENT,
         title="Client library keeps the fields",
         rule="a field present in raw HTTP but lost through the client library is the client's defect",
         evidence="probes/agent/<case>/*",
         source="docs/sources.md#a003: client library (a field lost)")
register("agent.multimodal", stage="agent", consequence=AGENT,
         title="Multimodal request",
         rule="where the service takes images, an image request is answered and the image reached the model",
         evidence="probes/agent/<case>/*",
         source="docs/sources.md#a003: a multimodal request where the service takes images")
register("agent.under_load", stage="agent", consequence=AGENT,
         title="Agent checks hold under load",
         rule=("the case set sent again with the contracted concurrency in flight (--under-load N, "
              "agent.under_load): no case that passed served alone fails under load (schema-invalid arguments, "
              "markup in content, a lost field, a 5xx); the failing cases, the concurrency and the layer are named "
              "(the gateway's when the direct server passes the same cases under the same load)"),
         evidence="probes/agent/cases.json, cases-under-load.json",
         source="issue 29: failures that reach production appear when many guided-decoding and tool-parsing "
                "requests run at once")
register("agent.reference_agreement", stage="agent", consequence=AGENT,
         title="Tool calls agree with the reference",
         rule=("with a reference endpoint (agent_reference_url / --reference-url), the case set sent to it too: "
              "tool-call F1 on triggering (the reference's calls are the positive class) >= "
              "thresholds.reference_agreement_min (default 0.80), once both sides answered >= "
              "thresholds.reference_min_cases cases (fewer: inconclusive, with the count); arguments: "
              "agent.reference_arguments; no reference: not_applicable, never pass"),
         evidence="probes/agent/reference.json",
         source=("Moonshot K2-Vendor-Verifier: tool-call F1 against the official API, thresholds F1 >= 80 % for "
                 "K2-0905 and >= 73 % for K2-thinking (docs/sources.md#k2-vendor-verifier)"))
register("agent.tool_choice", stage="agent", consequence=AGENT,
         title="The expected tool called, tool_choice honoured",
         rule=("per case of the case set: a call of a tool the case does not expect is a wrong tool (single, "
              "parallel: the called names a subset of the expected set; irrelevance: a write call); wrong read "
              "tools: 95 % upper bound of their share of call cases <= thresholds.wrong_tool_rate; wrong write "
              "tools (the pack's write_tools) severe: share <= thresholds.wrong_write_tool_rate, 0 by default (any "
              "one fails); tool_choice required / none / named honoured; a parallel tool called more often than "
              "the set asks"),
         evidence="probes/agent/cases.json",
         source=("issue 44: a call of another tool, a write included, was counted as a miss; Kimi-Vendor-Verifier "
                 "tests/k3_features/test_tool_choice.py (auto / none / required) "
                 "(docs/sources.md#kimi-vendor-verifier)"))
register("agent.reference_arguments", stage="agent", consequence=AGENT,
         title="Tool-call arguments agree with the reference",
         rule=("with a reference endpoint, on the cases both sides call: arguments compared per value by the "
              "tool's schema (enum, id, boolean exact; numbers as numbers; free text after collapsing whitespace; "
              "no semantic equality); the agreeing share >= thresholds.reference_argument_min, once both sides "
              "answered >= thresholds.reference_min_cases cases (fewer: inconclusive, with the count)"),
         evidence="probes/agent/reference.json",
         source=("issue 44: argument agreement per case was recorded and never judged; K2-Vendor-Verifier compares "
                 "a vendor with the official API request by request (docs/sources.md#k2-vendor-verifier)"))
register("agent.timeouts", stage="agent", consequence=AGENT,
         title="Hung agent requests",
         rule="a request without a complete answer within agent.request_timeout_s decides nothing; it is named",
         evidence="probes/agent/*",
         source="docs/sources.md#a003: hung requests are named, never a pass")

# --- quality: output parity ----------------------------------------------------------------------
# The quality probe (probes/quality/, opt-in: acceptance_probes names it; docs/acceptance.md "Output parity"): the
# seeded greedy prompt set on the path under test against a reference path of the same weights.

register("quality.probe", stage="quality", consequence=REBUILD,
         title="Quality probe ran",
         rule="the quality probe ran to its end and wrote its result",
         evidence="findings/quality.json, stages/quality.json",
         source="issue 45 item 3: accuracy regressions on paths that change the arithmetic are quiet")
register("quality.reference", stage="quality", consequence=REBUILD,
         title="A reference path answered the prompt set",
         rule=("quality_reference_url (or, for a P/D deployment without it, a prefill instance called directly) "
               "answered every prompt of the seeded set, alone and quality.concurrency at once; not given where "
               "the deployment has a path that changes the arithmetic (P/D pools, speculative decoding, fp8 KV, "
               "DCP, quality.path other than reference): missing; unreachable or answering too few: "
               "inconclusive; neither: not_applicable"),
         evidence="probes/quality/reference.jsonl, probes/quality/floor.jsonl",
         source=("issue 45 item 3; docs/sources.md#quality-parity: K3 1P1D garbled output (vllm#52627), fp8 KV "
                 "GSM8K drop, DCP drift (vllm#41623): only a comparison with the reference shows them"))
register("quality.parity", stage="quality", consequence=REBUILD,
         title="The path under test answers like the reference",
         rule=("the seeded prompt set (short, long up to the contract, multi-turn, tool call) sent greedy "
               "(temperature 0, fixed seed, quality.max_tokens) to both paths, compared token by token "
               "(return_token_ids, else logprobs tokens, else characters): where the reference reproduced itself "
               "batched on every prompt (batch-invariant) any divergence fails; else the share of prompts "
               "identical and the mean prefix agreement (first divergent position / length) may fall below the "
               "reference's own floor by at most quality.margin. A fail names the prompt, the first divergent "
               "position and both tokens; a prompt not compared is inconclusive, never a pass"),
         evidence="probes/quality/reference.jsonl, floor.jsonl, test.jsonl, comparison.json",
         source=("issue 45 item 3; docs/sources.md#quality-parity: garbled P/D output (vllm#52627), DSpark "
                 "acceptance collapse (vllm#51009), NVFP4 degenerate output (vllm#51798), DCP drift (vllm#41623)"))
register("quality.path_checks", stage="quality", consequence=REBUILD,
         title="The deployment's path checks ran",
         rule=("every path check that applies to the deployment (probes/quality/hooks.py PATH_CHECKS: the P/D "
               "pools' counters, speculative decoding's acceptance) ran before and after the parity pass; one "
               "that stopped is missing, never a pass; none applies: not_applicable"),
         evidence="probes/quality/path-check-*.txt",
         source="issue 45 items 2 and 4: the path that answered is proven by its own counters")

# --- capacity under load -------------------------------------------------------------------------

register("capacity.probe", stage="load", consequence=EXPAND,
         title="Load probe ran",
         rule="the load probe ran to its end and wrote its result",
         evidence="findings/load.json, stages/load.json",
         source="docs/sources.md#a000: capacity under load, stage by stage")
register("capacity.load", stage="load", consequence=EXPAND,
         title="Load stage ran",
         rule="the load stage wrote findings/load.json for this run",
         evidence="findings/load.json",
         source="docs/sources.md#a000: capacity under load, stage by stage")
register("capacity.metrics", stage="load", consequence=EXPAND,
         title="Load metrics readable",
         rule="the server's metrics are readable before and during the load",
         evidence="probes/load/metrics.jsonl",
         source="docs/sources.md#a000: per step record running, waiting, queue time, KV usage, preemptions")
register("capacity.long_prompt", stage="load", consequence=EXPAND,
         title="One long request near the contracted context",
         rule="one long request at the contracted context (counted with /tokenize), concurrency 1, answered "
              "without OOM; memory during prefill and during decode recorded",
         evidence="probes/load/records/long_prompt.jsonl, memory.jsonl",
         source="docs/sources.md#a000: stage 2, one long request")
register("capacity.context_contract", stage="load", consequence=EXPAND, warn_blocks=False,
         title="Context contract enforced",
         rule="a request at the contracted context (context + max output) succeeds; one over the served max_model_len "
              "(the contract's window where they are equal) is rejected for its length before the GPUs are "
              "exhausted, the server still healthy; where the server serves more than the contract, a request over "
              "the contract that is served is a warn that nothing enforces it (--max-model-len or a gateway limit), "
              "which does not block release by itself; 401/404/429 decide nothing",
         evidence="probes/load/context_contract.json",
         source="docs/sources.md#a000: the contract test: a request over the contracted context must be rejected; SPEC "
                "'Hardware the recipe verifies': a site contract below the recipe's --max-model-len follows the recipe")
register("capacity.ramp", stage="load", consequence=EXPAND,
         title="Concurrency ramp at the contracted shape: knee and headroom",
         rule="knee = largest concurrency meeting the SLO (latency and queue p95) with no errors, no KV saturation "
              "and preemptions within the profile's threshold; the ramp goes past the contract (load.max_step, "
              "load.ramp_budget_s); knee >= contracted concurrency",
         evidence="probes/load/ramp.json, records/ramp_c*.jsonl, samples.jsonl",
         source="docs/sources.md#a000: stage 3, concurrency ramp")
register("capacity.kv_capacity", stage="load", consequence=EXPAND,
         title="KV cache holds the contract",
         rule="contracted concurrency x (contracted context + max output) <= KV cache tokens of the startup log",
         evidence="probes/load/kv_capacity.json: startup log KV readout; /metrics cache_config_info (block size, "
                  "GPU blocks)",
         source="docs/sources.md#a000: the KV cache read out at start-up must hold the contract")
register("capacity.verified_limit", stage="load", consequence=EXPAND,
         title="A proposed limit verified by a run at that limit",
         rule="a limit (fewer sessions, or a shorter context) is recommended only when a run at it holds in the "
              "same run, on the server relaunched with the limit's flags when this run launched it on one node "
              "(else the client driven at the limit); every admissible setting run and failed -> "
              "expand_capacity; a setting the server could not be relaunched with is untested (inconclusive)",
         evidence="probes/load/verified_limit.json, records/verify_*.jsonl, relaunch.jsonl",
         source="docs/sources.md#a000, #a004: stable only below the contract -> limited observation with the limit in "
                "config and alerts")
register("capacity.mixed", stage="load", consequence=EXPAND,
         title="Mixed stream",
         rule="short, long, cold and repeated requests together: the repeated requests' hit ratio holds over the "
              "windows, queue time does not grow window over window, no errors",
         evidence="probes/load/mixed.json, records/mixed*.jsonl",
         source="docs/sources.md#a000: stage 4, mixed stream")
register("capacity.soak", stage="load", consequence=EXPAND,
         title="Soak",
         rule="steady load for the agreed time: no steady memory rise, no restarts, no hung requests, "
              "preemptions within the threshold, no communication (NCCL) errors in the log over the window; memory "
              "is the server's own (a local pid's RSS, process_resident_memory_bytes from its /metrics, its "
              "container's cgroup) and each GPU's, every series judged alone, the worst deciding: any rising past "
              "the limit fails; GPU memory alone never passes it (vLLM preallocates it, so a host-memory leak leaves "
              "it flat): without the server's own memory the soak is inconclusive",
         evidence="probes/load/soak.json, records/soak.jsonl, memory.jsonl (rss:vllm, rss:/metrics), the nodes' "
                  "GPU memory series, server log",
         source="docs/sources.md#a000: stage 5, soak: a steady memory rise blocks release")
register("capacity.crash", stage="load", consequence=EXPAND,
         title="OOM or crash under load",
         rule="no OOM or crash at nominal load; the OOM record names the stage (load, long prefill, decode, "
              "concurrency, KV growth) from evidence and the action for it",
         evidence="probes/load/oom_record.json, samples.jsonl, memory.jsonl, server log tail",
         source="docs/sources.md#a000: any OOM at nominal load blocks release")
register("capacity.distributed", stage="loadgen", consequence=EXPAND,
         title="Distributed load from every loadgen host",
         rule="every loadgen host sent its share from a shared start, clocks aligned; the merged step meets the "
              "SLO with no preemption",
         evidence="probes/load-distributed/*",
         source="docs/sources.md#a000: one client host cannot always saturate a multi-node deployment")
register("capacity.loadgen", stage="loadgen", consequence=EXPAND,
         title="The load generator kept up with every load step",
         rule="per step: CPU of each worker process <= loadgen.max_cpu_pct of a core, event-loop lag p99 <= "
              "loadgen.max_loop_lag_p99_s, send lag p99 <= min(loadgen.max_send_lag_p99_s, "
              "loadgen.send_lag_ttft_fraction x SLO TTFT p95); a saturated step is inconclusive, never a "
              "capacity verdict",
         evidence="probes/load/client.json, the client self-check of every step in the load stage details",
         source="product rule (README, load generator self-check): a client that is its own bottleneck "
                "must not blame the server; docs/sources.md#a000: the load stages it guards")

# The metrics probe (probes/metrics/, opt-in: acceptance_probes names it): the server exports what the
# generated monitoring reads (monitoring/series.py).
register("capacity.metrics_probe", stage="metrics", consequence=LIMIT,
         title="Metrics probe ran",
         rule="the metrics probe ran to its end and wrote its result",
         evidence="findings/metrics.json, stages/metrics.json",
         source="docs/sources.md#a004: alert thresholds from the accepted test, monitoring enabled on release")
register("capacity.alert_series", stage="metrics", consequence=LIMIT,
         title="The server exports what the generated monitoring reads",
         rule="every vLLM series the generated alerts and recording rules read is exported with samples (fail "
              "otherwise: that alert can never fire); a dashboard-only series missing is a warning",
         evidence="probes/metrics/metrics.prom (or series.json through Prometheus)",
         source="docs/sources.md#a003 and #a004: the first monitoring after release and its alert series; "
                "docs/sources.md#vllm-metrics: --disable-log-stats drops the engine's series")

# --- after remediation: the decision on four signs (rebuild/decision.py) --------------------------

register("compat.remediation.recurrence", stage="rebuild", consequence=REBUILD,
         title="The original error does not recur after remediation",
         rule="every check that failed in the acceptance before the change passes in the re-run (same host, or "
              "every host that judges it in another environment); not judged again is missing, never fixed",
         evidence="report.json of the run before the change and of the re-run",
         source="docs/sources.md#a001 'Stable observation': does the original error recur")
register("compat.remediation.prefix_cache", stage="rebuild", consequence=REBUILD,
         title="Prefix caching behaves after remediation",
         rule="the re-run's cache family (and compat.actual_config.prefix_caching) has no failed, missing or "
              "inconclusive finding and at least one passing cache finding",
         evidence="report.json of the re-run (cache.* findings)",
         source="docs/sources.md#a001 'Stable observation': is the expected prefix-caching behaviour kept")
register("compat.remediation.agent", stage="rebuild", consequence=REBUILD,
         title="Agent tools and structured output work after remediation",
         rule="the re-run's agent family has no failed, missing or inconclusive finding; agent.tool_call and "
              "agent.structured_output pass",
         evidence="report.json of the re-run (agent.* findings)",
         source="docs/sources.md#a001 'Stable observation': do the agent tools and structured output work correctly")
register("compat.remediation.manual_actions", stage="rebuild", consequence=REBUILD,
         title="Manual actions the environment needed",
         rule="the rebuild record states its manual actions (never assumed zero) and they are at most the allowed "
              "count (--max-manual-actions, default 0)",
         evidence="rebuild.json manual_actions (vllm-acceptance rebuild-manual)",
         source="docs/sources.md#a001 'Stable observation': how many manual actions the environment's upkeep needs")

# --- the self-built (experimental) image: lineage, reproducibility, scope (rebuild/lineage.py) ----

register("compat.lineage.complete", stage="rebuild", consequence=REBUILD,
         title="Self-built image lineage complete",
         rule="source repository, branch and commit, Dockerfile, dependency sources and lock files, compile "
              "options, patches, build log, image digest, rollback image, owner and a future exit date are "
              "recorded; each missing field is named",
         evidence="the experimental profile's lineage, evidence/build/lineage.json",
         source="docs/sources.md#a001 'Remediation playbooks': self-built image for another CUDA")
register("compat.lineage.reproducible", stage="rebuild", consequence=REBUILD,
         title="Self-built image reproduces from its recorded inputs",
         rule="a rebuild from the recorded inputs (same commit, Dockerfile, lock files, compile options, patches) "
              "gives the recorded image digest; otherwise the differing inputs or layers are listed",
         evidence="lineage.json of the build and of the rebuild (playbooks/build_image.yml)",
         source="docs/sources.md#a001: a build that cannot be reproduced from scratch never becomes a long-term base")
register("compat.lineage.official_diff", stage="rebuild", consequence=LIMIT,
         title="Self-built image's results against the last official run",
         rule="the experimental run is compared with the last official-profile run of the same inventory; a check "
              "that passes on the official image and fails on the self-built one is a regression",
         evidence="report.json of the experimental run and of the last official run",
         source="docs/sources.md#a001: the differences from the official image's results")
register("compat.lineage.release_scope", stage="report", consequence=LIMIT,
         title="Experimental release only on its own experimental profile",
         rule="a release of a self-built image is allowed only on its own experimental profile (a name other than "
              "its base profile), with complete lineage, a reproducible build and an exit date not passed; it is "
              "labelled experimental and never stands for the official profile; a profile whose image, CUDA major, "
              "forbidden tag suffixes, driver or vLLM minimums differ from its recipe's (or the official profile it "
              "extends) and is not declared experimental fails",
         evidence="the run's profile (experimental, lineage, recipe record), run.json recipe_deviations, the "
                  "lineage checks",
         source="docs/acceptance.md: a self-built image is released only on its own experimental profile, never as "
                "acceptance of the official image")

# --- quality: speculative decoding (probes/quality/spec_decode.py; issue 45 item 4) -------------------

register("quality.spec_acceptance", stage="quality", consequence=LIMIT,
         title="Speculative decoding accepts its drafts",
         rule=("where the served launch has a speculative config: the server's spec-decode counters over the quality "
               "probe's requests (and the check's own seeded greedy ones): >= quality.spec_decode.min_drafts drafts "
               "(fewer: inconclusive, with the count), mean acceptance length (1 + accepted / drafts) >= "
               "quality.spec_decode.min_acceptance_length, and no collapse after the first position: accepted at "
               "position i over accepted at position i-1 >= quality.spec_decode.min_continuation wherever position "
               "i-1 holds >= quality.spec_decode.min_position_drafts accepted drafts; a speculative config whose "
               "server exports no spec-decode series is missing, never pass; no speculative config: not_applicable"),
         evidence="probes/quality/spec-metrics-before.prom, spec-metrics-after.prom, spec-acceptance.json",
         source=("docs/sources.md#spec-decode: vllm#51009 (DSpark acceptance collapses after position 0, mean length "
                 "1.46 of 5); vLLM's K3 launch post (~4.73 accepted tokens per step on coding, ~2.61 on creative "
                 "writing); vLLM's spec-decode metrics (vllm/v1/spec_decode/metrics.py)"))
register("quality.spec_throughput", stage="quality", consequence=LIMIT,
         title="Speculative decoding does not lower throughput at the contract",
         rule=("where the served launch has a speculative config and a reference without it is given "
               "(quality_reference_url): quality.spec_decode.throughput_requests seeded requests at "
               "contract.concurrency through the load engine to each, after contract.concurrency warm-up requests "
               "to each, in two halves sent path, reference, reference, path; the path's output tokens/s >= the "
               "reference's x (1 - quality.spec_decode.throughput_tolerance); a failed or saturated measurement is "
               "inconclusive; no reference: not_applicable, never pass"),
         evidence="probes/quality/spec-throughput.json, spec-throughput-{path,reference}-{1,2}.jsonl",
         source=("docs/sources.md#spec-decode: the K3 recipe makes spec_decoding opt-in for throughput; vLLM's DSpark "
                 "post (rejected drafts compete with real tokens at high batch: throughput drops); tokenspeed#1132 "
                 "(K3 DSpark 28-41 % slower than without it at long context)"))
# --- drift: day-N re-check ------------------------------------------------------------------------
# The re-check's findings (recheck/judge.py), written to recheck.json beside today's re-check run, never to an
# acceptance report.json. A `fail` here is a drift: its consequence in the re-check is `reopen` or `drifted`
# (docs/recheck-judging.md); the consequence below is what it would mean for a full acceptance.

_RECHECK_SOURCE = "docs/recheck-judging.md: judged against the signed baseline, not the profile alone"
for _key, _title, _consequence in (
        ("image", "container image or digest", REBUILD), ("driver", "host driver version", REBUILD),
        ("topology", "topology (nodes, GPUs, parallel layout)", EXPAND),
        ("context_limit", "context limit or concurrency", EXPAND), ("recipe", "recipe record", REBUILD)):
    register(f"drift.{_key}", stage="recheck", consequence=_consequence,
             title=f"Re-check: {_title} as signed",
             rule=f"today's {_title} equals the signed baseline's (report/reopen.py fact `{_key}`); a change fires "
                  "the reopen trigger of that name: `reopen`",
             evidence="report.json of the baseline and of today's re-check run",
             source="docs/report.md: a signed acceptance holds for the facts it was signed on (reopen triggers)")
register("drift.served_model", stage="recheck", consequence=REBUILD,
         title="Re-check: the weights served as signed",
         rule="today's /v1/models ids and roots, hub revision and checkpoint config hash (compat.served_model) and "
              "every identity argument of the argv (core/model_identity.py) equal the baseline's; a change reopens",
         evidence="compat.served_model of both runs, evidence/serve/process-args.json",
         source=_RECHECK_SOURCE)
register("drift.parser", stage="recheck", consequence=AGENT,
         title="Re-check: tool and reasoning parser as signed",
         rule="--tool-call-parser, --reasoning-parser, --enable-auto-tool-choice (and the parser plugin, the "
              "chat template content format) equal the baseline's; a change reopens (another agent interface)",
         evidence="evidence/serve/process-args.json or compat.startup_log non-default args of both runs",
         source=_RECHECK_SOURCE)
register("drift.serve_args", stage="recheck", consequence=EXPAND,
         title="Re-check: the live server's arguments as signed",
         rule="every flag of the running server's argv equals the baseline's; a context, capacity or parallel-layout "
              "argument added, removed or changed reopens (rules context_limit, topology), any other is `drifted`",
         evidence="evidence/serve/process-args.json or compat.startup_log non-default args of both runs",
         source=_RECHECK_SOURCE)
register("drift.environment", stage="recheck", consequence=LIMIT,
         title="Re-check: the live server's environment as signed",
         rule="every variable of the serving process's environment equals the baseline's (values of secret names "
              "redacted); a change is `drifted`, and touches the signed decision when the engine reads it "
              "(NCCL_, CUDA_, VLLM_, ...)",
         evidence="evidence/preflight/<host>/live_process of both runs",
         source=_RECHECK_SOURCE)
register("drift.agent_rate", stage="recheck", consequence=AGENT,
         title="Re-check: agent rates inside the baseline's interval",
         rule="each agent rate today (format errors, schema accuracy, separation, wrong tool...) against the "
              "baseline's two-sided 95 % Clopper-Pearson interval: provably worse is a regression (`drifted`); a "
              "sample whose 95 % bound cannot show it within the accepted level is `incomplete`",
         evidence="the agent findings' observed rate (events, n) of both runs",
         source=_RECHECK_SOURCE)
register("drift.cache_rate", stage="recheck", consequence=LIMIT,
         title="Re-check: prefix-cache reuse inside the baseline's bounds",
         rule="cache.hot_reuse requests that reached the expected hits against the baseline's interval, and the "
              "window's hit ratio not below the lowest window hit ratio the acceptance measured",
         evidence="cache.hot_reuse and capacity.mixed of both runs, report.json stages.window",
         source=_RECHECK_SOURCE)
register("drift.capacity_rate", stage="recheck", consequence=EXPAND,
         title="Re-check: capacity rates inside the baseline's interval",
         rule="a capacity finding's rate (events, n) today against the baseline's 95 % interval",
         evidence="the capacity findings' observed rate of both runs",
         source=_RECHECK_SOURCE)
register("drift.error_rate", stage="recheck", consequence=EXPAND,
         title="Re-check: request error rate inside the baseline's interval",
         rule="errors and timeouts per request (load steps, windows, soak, the server's window counters) against "
              "the baseline's 95 % interval",
         evidence="capacity.ramp, capacity.mixed, capacity.soak, report.json stages.window of both runs",
         source=_RECHECK_SOURCE)
register("drift.preemptions", stage="recheck", consequence=EXPAND,
         title="Re-check: preemptions per request inside the baseline's interval",
         rule="preemptions per request (load steps, the server's window counters) against the baseline's 95 % "
              "interval",
         evidence="capacity.ramp steps, report.json stages.window of both runs",
         source=_RECHECK_SOURCE)
register("drift.tool_parse_failures", stage="recheck", consequence=AGENT,
         title="Re-check: tool-call parse failures inside the baseline's interval",
         rule="tool-call parse failures per tool call over the window (the server's log) against the baseline's "
              "95 % interval",
         evidence="report.json stages.window of both runs",
         source=_RECHECK_SOURCE)
register("drift.check_status", stage="recheck", consequence=LIMIT,
         title="Re-check: every check that passed when signed still passes",
         rule="a check that passed (or warned) in the signed run and fails today is a drift that touches the signed "
              "decision",
         evidence="the findings of both runs",
         source=_RECHECK_SOURCE)
# --- quality: the P/D path (probes/quality/pd_path.py, pd_stop.py; docs/sources.md#pd-path) -----------------------

register("quality.pd_prefill_served", stage="quality", consequence=REBUILD,
         title="The prefill pool served the prompts",
         rule="over the parity pass, the prefill instances' prefill requests (max_tokens 1: the le=1 bucket of their "
              "own vllm:request_params_max_tokens, so that the reference path's answers sent to a prefill instance "
              "do not count) rose by at least the prompts sent through the entry point, and, when the pass sent at "
              "least one prompt per prefill instance, no prefill instance stayed at 0; an unreadable counter is "
              "missing, a pass that sent nothing inconclusive",
         evidence="pd_path/{before,after}-prefill-N.metrics.txt, pd_path/counters.json",
         source="docs/sources.md#pd-path: a prefill side served 0 requests without any error (modelplane#175)")
register("quality.pd_decode_loaded", stage="quality", consequence=REBUILD,
         title="The decode pool loaded the prompts, not recomputed them",
         rule="each decode instance's vllm:prompt_tokens_by_source{source=\"local_compute\"} rose by at most one KV "
              "block (its vllm:cache_config_info block_size) per request it finished: the tail a connector cannot "
              "carry; the rest came through the connector (external_kv_transfer) or its own prefix cache; the decode "
              "pool finished at least the prompts sent; prompts no longer than that tail are inconclusive, a missing "
              "family missing",
         evidence="pd_path/{before,after}-decode-N.metrics.txt, pd_path/counters.json",
         source="docs/sources.md#pd-path: vLLM 0.32 v1/metrics/stats.py PromptTokenStats (computed + local cache hit "
                "+ external transfer = prompt tokens); K3 1P1D over NIXL garbled (vllm#52627)")
register("quality.pd_transfer_failures", stage="quality", consequence=REBUILD,
         title="KV transfers did not fail",
         rule="over the parity pass no decode request finished with reason error (a failed KV load under "
              "kv_load_failure_policy fail) and the connector's failure counters (NIXL: vllm:nixl_num_failed_transfers "
              "+ vllm:nixl_num_failed_notifications, every instance) did not rise: fail under policy fail, warn naming "
              "the recomputed failures under recompute; a connector without failure counters under recompute is "
              "inconclusive",
         evidence="pd_path/counters.json, the instances' /metrics",
         source="docs/sources.md#pd-path: the server reports healthy while KV transfers fail (vllm#42895); "
                "vllm#58038 (every request HTTP 500, vllm:nixl_num_failed_transfers_total 17960)")
register("quality.pd_prefill_stopped", stage="quality", consequence=REBUILD,
         title="A stopped prefill instance makes requests fail loudly",
         rule="with one prefill instance stopped (its stop_command) each request through the entry point ends in an "
              "HTTP error or an error body, never text, an empty answer or a hang; every decode instance answers "
              "/health meanwhile and after the start_command, and a request after it answers; not_applicable when "
              "quality.pd_stop_prefill is false, or unset on a deployment without stop/start commands (attached); "
              "true without them is missing; a prefill that cannot be stopped or restarted is inconclusive",
         evidence="pd_path/stop-prefill.json, pd_path/stop-prefill.log",
         source="docs/sources.md#pd-path: a stopped prefill must never let the decode answer without its KV "
                "(vllm#52627 garbled output)")
