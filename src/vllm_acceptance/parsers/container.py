"""Container facts: `docker|podman image inspect`, `version`/`info --format '{{json .}}'`, and the
JSON printed by the probe run inside the actual image (or the lab interpreter).

On a Kubernetes node with containerd or CRI-O and no docker/podman (issue 42 item 5) the preflight reads the same
facts with crictl (roles/preflight/templates/commands.yml.j2; docs/sources.md#crictl-node): `crictl inspecti -o json
IMAGE` (the CRI ImageStatus: `status.id`, `repoTags`, `repoDigests`; containerd's verbose `info.imageSpec`, the OCI
image config: created, architecture, `config.Env`/`Labels`/`Entrypoint`; CRI-O prints no `info`), `crictl info`
(the CRI runtime status and, containerd, its CRI config) and `crictl version` (text). Each parser below reads either
shape by its content; the record's meta says which command ran."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .base import Parsed, cuda_major


def _load_json(text: str, result: Parsed) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        result.errors.append(f"not valid JSON: {exc}")
        return None


def env_list_to_dict(items: Any) -> dict[str, str]:
    env: dict[str, str] = {}
    if isinstance(items, list):
        for item in items:
            if isinstance(item, str) and "=" in item:
                key, value = item.split("=", 1)
                env[key] = value
    return env


@dataclass
class ImageInspect(Parsed):
    id: str | None = None
    repo_tags: list[str] = field(default_factory=list)
    repo_digests: list[str] = field(default_factory=list)
    created: str | None = None
    last_tag_time: str | None = None     # docker's Metadata.LastTagTime: when it was pulled/tagged
    architecture: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    entrypoint: list[str] = field(default_factory=list)

    @property
    def digests(self) -> list[str]:
        """sha256:... of every RepoDigest."""
        return [d.split("@", 1)[1] for d in self.repo_digests if "@" in d]

    @property
    def cuda_version(self) -> str | None:
        """CUDA the image was built for, from its environment (CUDA_VERSION, NV_CUDA_CUDART_VERSION)."""
        return self.env.get("CUDA_VERSION") or self.env.get("NV_CUDA_CUDART_VERSION")

    @property
    def cuda_major(self) -> int | None:
        return cuda_major(self.cuda_version)


def parse_image_inspect(text: str) -> ImageInspect:
    result = ImageInspect()
    data = _load_json(text, result)
    if data is None:
        return result
    if isinstance(data, list):
        if not data:
            result.errors.append("image inspect returned an empty list (image not present?)")
            return result
        data = data[0]
    if not isinstance(data, dict):
        result.errors.append(f"expected an object, got {type(data).__name__}")
        return result
    if isinstance(data.get("status"), dict) and "Id" not in data:
        return _crictl_image(data, result)
    config = data.get("Config") if isinstance(data.get("Config"), dict) else {}
    result.id = data.get("Id") if isinstance(data.get("Id"), str) else None
    result.repo_tags = [t for t in data.get("RepoTags") or [] if isinstance(t, str)]
    result.repo_digests = [d for d in data.get("RepoDigests") or [] if isinstance(d, str)]
    result.created = data.get("Created") if isinstance(data.get("Created"), str) else None
    metadata = data.get("Metadata") if isinstance(data.get("Metadata"), dict) else {}
    result.last_tag_time = metadata.get("LastTagTime") if isinstance(metadata.get("LastTagTime"), str) else None
    result.architecture = data.get("Architecture") if isinstance(data.get("Architecture"), str) else None
    _config_fields(result, config, config.get("Labels") or data.get("Labels") or {})
    if result.id is None:
        result.errors.append("no image Id in inspect output")
    return result


def _config_fields(result: ImageInspect, config: dict[str, Any], labels: Any) -> None:
    """Labels, environment and entrypoint of an image config (docker/podman `Config`, containerd's
    `imageSpec.config`: the OCI image config's field names)."""
    result.labels = {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}
    result.env = env_list_to_dict(config.get("Env"))
    entry = config.get("Entrypoint")
    result.entrypoint = [str(e) for e in entry] if isinstance(entry, list) else []


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _crictl_image(data: dict[str, Any], result: ImageInspect) -> ImageInspect:
    """`crictl inspecti -o json` (CRI ImageStatus): the image ID, tags and digests from `status`; created,
    architecture, labels, environment and entrypoint from containerd's `info.imageSpec` (absent with CRI-O)."""
    status = data["status"]
    spec = _dict(_dict(data.get("info")).get("imageSpec"))
    config = _dict(spec.get("config"))
    result.id = _text(status.get("id"))
    result.repo_tags = [t for t in status.get("repoTags") or [] if isinstance(t, str)]
    result.repo_digests = [d for d in status.get("repoDigests") or [] if isinstance(d, str)]
    result.created = _text(spec.get("created"))
    result.architecture = _text(spec.get("architecture"))
    _config_fields(result, config, config.get("Labels"))
    if result.id is None:
        result.errors.append("no status.id in the crictl inspecti output")
    if not spec:
        result.errors.append("no info.imageSpec (CRI-O's crictl inspecti prints none): the image's environment, "
                             "labels and architecture are unknown")
    return result


@dataclass
class RuntimeInfo(Parsed):
    """`docker info` / `podman info` (JSON) and `docker version` / `podman version` (JSON)."""

    server_version: str | None = None
    client_version: str | None = None
    runtimes: list[str] = field(default_factory=list)
    default_runtime: str | None = None
    cdi_devices: list[str] = field(default_factory=list)
    kernel: str | None = None
    operating_system: str | None = None

    @property
    def gpu_capable(self) -> bool:
        """An NVIDIA runtime registered or NVIDIA CDI devices discovered."""
        return "nvidia" in self.runtimes or any(d.startswith("nvidia.com/gpu") for d in self.cdi_devices)


def parse_runtime_info(text: str) -> RuntimeInfo:
    result = RuntimeInfo()
    data = _load_json(text, result)
    if not isinstance(data, dict):
        if data is not None:
            result.errors.append("expected a JSON object")
        return result
    if "host" in data and isinstance(data["host"], dict):   # podman info
        host = data["host"]
        runtime = host.get("ociRuntime") or {}
        result.default_runtime = runtime.get("name") if isinstance(runtime, dict) else None
        result.runtimes = [result.default_runtime] if result.default_runtime else []
        result.kernel = host.get("kernel")
        distribution = host.get("distribution") or {}
        result.operating_system = distribution.get("distribution") if isinstance(distribution, dict) else None
        version = data.get("version") or {}
        result.server_version = version.get("Version") if isinstance(version, dict) else None
        return result
    if isinstance(data.get("status"), dict) and "ServerVersion" not in data:
        return _crictl_info(data, result)
    runtimes = data.get("Runtimes")
    result.runtimes = sorted(runtimes) if isinstance(runtimes, dict) else []
    result.default_runtime = data.get("DefaultRuntime")
    result.server_version = data.get("ServerVersion") or None
    result.kernel = data.get("KernelVersion")
    result.operating_system = data.get("OperatingSystem")
    devices = data.get("DiscoveredDevices") or []
    result.cdi_devices = [d.get("ID", "") for d in devices if isinstance(d, dict)]
    if result.server_version is None:
        result.errors.append("no ServerVersion: is the daemon reachable?")
    return result


def _crictl_info(data: dict[str, Any], result: RuntimeInfo) -> RuntimeInfo:
    """`crictl info` (CRI RuntimeStatus, verbose): containerd's CRI config names its runtimes
    (`config.containerd.runtimes`, `defaultRuntimeName`); a RuntimeReady condition that is false is an error."""
    containerd = _dict(_dict(data.get("config")).get("containerd"))
    runtimes = containerd.get("runtimes")
    result.runtimes = sorted(runtimes) if isinstance(runtimes, dict) else []
    result.default_runtime = _text(containerd.get("defaultRuntimeName"))
    conditions = [c for c in _dict(data.get("status")).get("conditions") or [] if isinstance(c, dict)]
    ready = [c for c in conditions if c.get("type") == "RuntimeReady"]
    if not ready:
        result.errors.append("no RuntimeReady condition in crictl info")
    elif ready[0].get("status") is not True:
        result.errors.append(f"runtime not ready: {ready[0].get('reason') or ''} {ready[0].get('message') or ''}"
                             .strip())
    return result


def parse_crictl_version(text: str) -> RuntimeInfo:
    """`crictl version` (text: `Version:  0.1.0`, `RuntimeName:  containerd`, `RuntimeVersion:  1.4.8`,
    `RuntimeApiVersion:  v1alpha2`): crictl's own version as the client, the runtime's as the server."""
    result = RuntimeInfo()
    fields = {k.strip(): v.strip() for k, sep, v in (line.partition(":") for line in text.splitlines()) if sep}
    result.client_version = fields.get("Version") or None
    name, version = fields.get("RuntimeName"), fields.get("RuntimeVersion")
    result.server_version = f"{name} {version}" if name and version else version or None
    result.default_runtime = name or None
    if result.server_version is None:
        result.errors.append("no RuntimeVersion in crictl version")
    return result


def parse_runtime_version(text: str) -> RuntimeInfo:
    if text.lstrip().startswith("Version:"):
        return parse_crictl_version(text)
    result = RuntimeInfo()
    data = _load_json(text, result)
    if not isinstance(data, dict):
        if data is not None:
            result.errors.append("expected a JSON object")
        return result
    client, server = data.get("Client"), data.get("Server")
    result.client_version = client.get("Version") if isinstance(client, dict) else None
    result.server_version = server.get("Version") if isinstance(server, dict) else None
    if result.server_version is None and result.client_version is None:
        result.errors.append("no Client/Server Version")
    return result


@dataclass
class Probe(Parsed):
    """What the snippet run inside the image (or the lab interpreter) reported."""

    raw: dict[str, Any] = field(default_factory=dict)
    cuda_json_version: str | None = None
    cudart_version: str | None = None
    libcudart: list[str] = field(default_factory=list)
    torch_version: str | None = None
    torch_cuda: str | None = None
    cuda_available: bool | None = None
    device_count: int | None = None
    devices: list[str] = field(default_factory=list)
    vllm_version: str | None = None
    vllm_dist: str | None = None
    driver_proc: str | None = None
    loaded_libs: list[str] = field(default_factory=list)
    nccl_version: str | None = None

    def cuda_majors(self) -> dict[str, int]:
        """Each independent in-image source of the CUDA runtime, reduced to its major."""
        found: dict[str, int] = {}
        for source, value in (("torch.version.cuda", self.torch_cuda),
                              ("/usr/local/cuda/version.json", self.cuda_json_version),
                              ("cudart (version.json)", self.cudart_version)):
            major = cuda_major(value)
            if major is not None:
                found[source] = major
        for soname in self.libcudart:
            major = cuda_major(soname)
            if major is not None:
                found[f"ldconfig: {soname}"] = major
        return found


def _str(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None


def parse_probe(text: str) -> Probe:
    result = Probe()
    # The probe prints one JSON object on its last line; anything before it is noise (banners).
    lines = [line for line in text.splitlines() if line.strip().startswith("{")]
    if not lines:
        result.errors.append("no JSON object in the probe output")
        return result
    data = _load_json(lines[-1], result)
    if not isinstance(data, dict):
        if data is not None:
            result.errors.append("probe output is not a JSON object")
        return result
    result.raw = data
    cuda_json = data.get("cuda_version_json")
    if isinstance(cuda_json, dict):
        cuda = cuda_json.get("cuda") or {}
        cudart = cuda_json.get("cuda_cudart") or {}
        result.cuda_json_version = _str(cuda.get("version")) if isinstance(cuda, dict) else None
        result.cudart_version = _str(cudart.get("version")) if isinstance(cudart, dict) else None
    libs = data.get("libcudart")
    result.libcudart = [str(x) for x in libs] if isinstance(libs, list) else []
    result.torch_version = _str(data.get("torch_version"))
    result.torch_cuda = _str(data.get("torch_cuda"))
    result.cuda_available = data.get("cuda_available") if isinstance(data.get("cuda_available"), bool) else None
    count = data.get("device_count")
    result.device_count = count if isinstance(count, int) and not isinstance(count, bool) else None
    devices = data.get("devices")
    result.devices = [str(d) for d in devices] if isinstance(devices, list) else []
    result.vllm_version = _str(data.get("vllm_version"))
    result.vllm_dist = _str(data.get("vllm_dist"))
    result.driver_proc = _str(data.get("driver_proc"))
    loaded = data.get("loaded_libs")
    result.loaded_libs = [str(x) for x in loaded] if isinstance(loaded, list) else []
    result.nccl_version = _str(data.get("nccl_version"))
    for key in ("torch_error", "vllm_error"):
        if data.get(key):
            result.errors.append(f"{key}: {str(data[key])[:200]}")
    return result
