# Run by the preflight role with the image's own python3 (docker/podman run --network host) on every
# GPU node at once, when all_reduce_perf is absent on the nodes (docs/checks.md,
# interconnect.nccl_bandwidth): the all-reduce bus bandwidth across every GPU of every node, measured
# with the torch and NCCL inside the image under test. Stock Python + torch only; it reads, it changes
# nothing. One process per GPU with the NCCL backend; when the image's torch sees no CUDA at all, one
# process per node with the gloo backend, and the output says so ("backend": "gloo").
# Bus bandwidth as nccl-tests defines it for all-reduce: algbw = bytes / time, busbw = algbw * 2(n-1)/n.
# Local rank 0 of every node prints one JSON line; the exit status is 0 only when every rank finished.
#   python3 -c "$(cat allreduce.py)" --nnodes N --node-rank R --master-addr A --master-port P --gpus G
import argparse
import json
import multiprocessing
import socket
import subprocess
import sys
import time
import traceback


def size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def arguments(argv):
    p = argparse.ArgumentParser(prog="allreduce")
    p.add_argument("--nnodes", type=int, required=True)
    p.add_argument("--node-rank", type=int, required=True)
    p.add_argument("--master-addr", required=True)
    p.add_argument("--master-port", type=int, default=29512)
    p.add_argument("--gpus", type=int, required=True, help="GPUs per node the test must span")
    p.add_argument("--min-bytes", type=size, default=size("8M"))
    p.add_argument("--max-bytes", type=size, default=size("1G"))
    p.add_argument("--factor", type=int, default=2)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--timeout", type=int, default=300, help="rendezvous and collective timeout (s)")
    return p.parse_args(argv)


def visible_gpus():
    """CUDA devices the image's torch sees, asked in a child so this process stays fork-safe."""
    code = "import torch;print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError("torch did not import in the image: " + (out.stderr.strip().splitlines() or ["?"])[-1])
    return int(out.stdout.strip().splitlines()[-1])


def worker(local_rank, nproc, backend, a, results):
    import datetime

    import torch
    import torch.distributed as dist

    rank = a.node_rank * nproc + local_rank
    world = a.nnodes * nproc
    try:
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
        else:
            device = torch.device("cpu")
        dist.init_process_group(backend, init_method=f"tcp://{a.master_addr}:{a.master_port}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=a.timeout))
        me = {"rank": rank, "host": socket.gethostname(),
              "device": torch.cuda.get_device_name(local_rank) if backend == "nccl" else "cpu"}
        ranks = [None] * world
        dist.all_gather_object(ranks, me)

        def sync():
            if backend == "nccl":
                torch.cuda.synchronize(device)

        rows = []
        nbytes = a.min_bytes
        while nbytes <= a.max_bytes:
            count = max(1, nbytes // 4)
            buf = torch.zeros(count, dtype=torch.float32, device=device)
            for _ in range(a.warmup):
                dist.all_reduce(buf)
            sync()
            dist.barrier()
            start = time.perf_counter()
            for _ in range(a.iters):
                dist.all_reduce(buf)
            sync()
            took = torch.tensor([(time.perf_counter() - start) / a.iters], dtype=torch.float64, device=device)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            # Correctness on fresh data: rank r contributes r + 1, the sum is world(world+1)/2 everywhere.
            check = torch.full((count,), float(rank + 1), dtype=torch.float32, device=device)
            dist.all_reduce(check)
            wrong = torch.tensor([int((check != world * (world + 1) / 2).sum().item())], dtype=torch.int64,
                                 device=device)
            dist.all_reduce(wrong)
            seconds = float(took.item())
            algbw = count * 4 / seconds / 1e9
            rows.append({"bytes": count * 4, "time_us": round(seconds * 1e6, 1), "algbw_gbps": round(algbw, 3),
                         "busbw_gbps": round(algbw * 2 * (world - 1) / world, 3), "wrong": int(wrong.item())})
            nbytes *= a.factor
        if local_rank == 0:
            results.put({"rows": rows, "ranks": ranks, "world_size": world, "nccl_version": (
                ".".join(str(x) for x in torch.cuda.nccl.version()) if backend == "nccl" else None),
                "torch_version": torch.__version__})
        dist.destroy_process_group()
    except Exception as exc:  # reported by the parent with the node's view
        results.put({"error": f"rank {rank}: {exc!r}"[:600], "traceback": traceback.format_exc()[-2000:]})
        raise SystemExit(1) from exc


def main(argv):
    a = arguments(argv)
    out = {"tool": "torch.distributed all_reduce", "node_rank": a.node_rank, "nnodes": a.nnodes,
           "host": socket.gethostname(), "gpus_expected": a.gpus, "master": f"{a.master_addr}:{a.master_port}"}
    try:
        gpus = visible_gpus()
    except Exception as exc:
        out["error"] = repr(exc)[:600]
        print(json.dumps(out))
        return 3
    out["gpus_visible"] = gpus
    if 0 < gpus < a.gpus:
        out["error"] = f"the container sees {gpus} GPU(s), the test spans {a.gpus} per node"
        print(json.dumps(out))
        return 3
    backend, nproc = ("nccl", a.gpus) if gpus else ("gloo", 1)
    out["backend"] = backend
    ctx = multiprocessing.get_context("fork")   # the parent never imported torch: fork is safe
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(i, nproc, backend, a, results)) for i in range(nproc)]
    for proc in procs:
        proc.start()
    deadline = time.time() + a.timeout * 2
    for proc in procs:
        proc.join(max(1.0, deadline - time.time()))
    stuck = [p for p in procs if p.is_alive()]
    for proc in stuck:
        proc.kill()
    errors = []
    while not results.empty():
        item = results.get()
        if "error" in item:
            errors.append(item["error"])
            out.setdefault("traceback", item.get("traceback"))
        else:
            out.update(item)
    if stuck:
        errors.append(f"{len(stuck)} local rank(s) still running after {a.timeout * 2} s: killed")
    if any(p.exitcode not in (0, None) for p in procs) and not errors:
        errors.append("a local rank exited with " + ", ".join(str(p.exitcode) for p in procs))
    if errors:
        out["error"] = "; ".join(errors)
    print(json.dumps(out))
    return 0 if not errors and "rows" in out else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
