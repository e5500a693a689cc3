# Run by the preflight role with the image's own python3 (docker/podman run) or the lab
# interpreter: stock Python only, prints one JSON line. It reads, it changes nothing.
import ctypes.util
import importlib.metadata as md
import json
import os
import platform
import subprocess

r = {"python": platform.python_version(), "machine": platform.machine()}
try:
    with open("/usr/local/cuda/version.json") as f:
        r["cuda_version_json"] = json.load(f)
except Exception as e:
    r["cuda_version_json_error"] = repr(e)[:200]
try:
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=30).stdout
    r["libcudart"] = sorted({ln.split()[0] for ln in out.splitlines() if "libcudart.so" in ln})
except Exception as e:
    r["libcudart_error"] = repr(e)[:200]
r["libcudart_ctypes"] = ctypes.util.find_library("cudart")
try:
    with open("/proc/driver/nvidia/version") as f:
        r["driver_proc"] = f.read()
except Exception:
    r["driver_proc"] = None
# IMEX channels inside the container (multi-node NVLink): the device nodes the NVIDIA container toolkit
# injected on request (NVIDIA_IMEX_CHANNELS / the channel device); None when the directory is absent.
try:
    r["imex_channels"] = sorted(os.listdir("/dev/nvidia-caps-imex-channels"))
except FileNotFoundError:
    r["imex_channels"] = None
except Exception as e:
    r["imex_channels_error"] = repr(e)[:200]
try:
    import torch
    r["torch_version"] = torch.__version__
    r["torch_cuda"] = torch.version.cuda
    r["cuda_available"] = torch.cuda.is_available()
    r["device_count"] = torch.cuda.device_count() if r["cuda_available"] else 0
    r["devices"] = [torch.cuda.get_device_name(i) for i in range(r["device_count"])]
    if r["cuda_available"]:
        r["nccl_version"] = ".".join(str(x) for x in torch.cuda.nccl.version())
except Exception as e:
    r["torch_error"] = repr(e)[:300]
try:
    import vllm
    r["vllm_version"] = getattr(vllm, "__version__", None)
    r["vllm_dist"] = ",".join(md.packages_distributions().get("vllm", [])) or None
    r["vllm_path"] = os.path.dirname(vllm.__file__)
except Exception as e:
    r["vllm_error"] = repr(e)[:300]
try:
    with open("/proc/self/maps") as f:
        libs = {ln.split()[-1] for ln in f if ".so" in ln and any(
            k in ln for k in ("libcudart", "libcuda.so", "libnccl", "libcublas", "libtorch_cuda"))}
    r["loaded_libs"] = sorted(libs)
except Exception:
    r["loaded_libs"] = []
print(json.dumps(r, sort_keys=True))
