"""PyTorch baseline: training steps/s of each corpus model, eager and DistributedDataParallel.

    python -m tracepass.export.bench_torch testdata/models [--ranks 1,2,4] [--steps 30] [--json FILE]
        [--device cuda] [--init-params]

For every plain export directory given (or found below a folder; `-ddp` exports are the same
models and are skipped), and every world size: one process per rank (spawned), gloo,
`torch.set_num_threads(1)` (`--threads`), the model built from the corpus registry with the export's own
`params.safetensors` loaded, batches from its `data.safetensors` (`<arg>.<step mod n>.<rank>`, passed
by keyword), the
loss of its `export.json`, AdamW (lr 1e-3). World size 1 is plain eager; more ranks wrap the model in
`DistributedDataParallel`. After `--warmup` steps, rank 0 times `--steps` steps between barriers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path


class BenchError(RuntimeError):
    pass


def load_export(d: Path) -> dict:
    meta_path = d / "export.json"
    if not meta_path.is_file():
        raise BenchError(f"{d}: no export.json")
    meta = json.loads(meta_path.read_text())
    for k in ("model", "loss", "output"):
        if k not in meta:
            raise BenchError(f"{meta_path}: missing `{k}`")
    return meta


def batches_of(data: dict, rank: int) -> list[tuple[dict, object]]:
    """This rank's batches, by step: ({arg: tensor}, targets)."""
    steps: dict[int, dict] = {}
    targets: dict[int, object] = {}
    for key, t in data.items():
        parts = key.rsplit(".", 2)
        if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
            raise BenchError(f"data key `{key}` is not <arg>.<step>.<rank>")
        arg, s, r = parts[0], int(parts[1]), int(parts[2])
        if r != rank:
            continue
        if arg == "targets":
            targets[s] = t
        else:
            steps.setdefault(s, {})[arg] = t
    if not steps:
        raise BenchError(f"no batch for rank {rank} in data.safetensors")
    return [(steps[s], targets.get(s)) for s in sorted(steps)]


def load_params(model, params: dict) -> None:
    import torch

    with torch.no_grad():
        for name, t in params.items():
            try:
                dst = model.get_parameter(name)
            except AttributeError:
                try:
                    dst = model.get_buffer(name)
                except AttributeError as e:
                    raise BenchError(f"params.safetensors has `{name}`, which the model lacks") from e
            if dst.shape != t.shape:
                raise BenchError(f"`{name}`: model has shape {tuple(dst.shape)}, export {tuple(t.shape)}")
            dst.copy_(t)


_SAFETENSORS_DTYPES = {"F32": "float32", "F64": "float64", "BF16": "bfloat16", "F16": "float16", "I64": "int64",
                       "I32": "int32", "BOOL": "bool", "U8": "uint8"}


def load_tensors(path: Path) -> dict:
    """A safetensors file as {name: tensor}: through the `safetensors` package, or where it is not
    installed (a lent GPU machine has torch alone), by reading the format itself: an 8-byte
    little-endian header length, a JSON header, then each tensor's little-endian bytes."""
    try:
        from safetensors.torch import load_file
    except ImportError:
        pass
    else:
        return load_file(str(path))
    import struct

    import torch

    raw = path.read_bytes()
    if len(raw) < 8:
        raise BenchError(f"{path}: not a safetensors file (shorter than its header length)")
    (n,) = struct.unpack("<Q", raw[:8])
    try:
        header = json.loads(raw[8 : 8 + n])
    except ValueError as e:
        raise BenchError(f"{path}: unreadable safetensors header: {e}") from e
    header.pop("__metadata__", None)
    out = {}
    for name, info in header.items():
        dtype = _SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype is None:
            raise BenchError(f"{path}: `{name}` has dtype {info['dtype']}, which this reader does not know")
        lo, hi = info["data_offsets"]
        buf = bytearray(raw[8 + n + lo : 8 + n + hi])
        t = torch.frombuffer(buf, dtype=getattr(torch, dtype)) if buf else torch.empty(0, dtype=getattr(torch, dtype))
        out[name] = t.reshape(info["shape"])
    return out


def init_params(export_dir: Path) -> Path:
    """Writes the export's `params.safetensors` from the model's own initialisation (seed 0):
    every state-dict entry, tied names and buffers included, as the exporter saves them. For an
    export folder shipped without its parameters (the GPU kit leaves them out, to fit the 64 MiB
    a lent machine takes); an existing file is never overwritten."""
    import ctypes
    import struct

    import torch

    from .mid_models import MID_MODELS
    from .models import MODELS

    meta = load_export(export_dir)
    spec = {**MODELS, **MID_MODELS}.get(meta["model"])
    if spec is None:
        raise BenchError(f"{export_dir}: model `{meta['model']}` is not in the corpus registry")
    dst = export_dir / "params.safetensors"
    if dst.exists():
        raise BenchError(f"{dst} exists; --init-params writes only a missing file")
    torch.manual_seed(0)
    names = {v: k for k, v in _SAFETENSORS_DTYPES.items()}
    header, blobs, at = {}, [], 0
    for name, t in spec.factory().state_dict().items():
        t = t.detach().cpu().clone().contiguous()
        # the bytes as they lie (little-endian here), without numpy, which torch may lack
        b = ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()) if t.numel() else b""
        header[name] = {"dtype": names[str(t.dtype).removeprefix("torch.")], "shape": list(t.shape),
                        "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    tmp = dst.with_suffix(".partial")
    tmp.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))
    tmp.replace(dst)
    return dst


def _worker(rank, world, port, export_dir, warmup, steps, result_dir, threads=1, device="cpu"):
    import torch
    import torch.distributed as tdist

    from .exporter import compute_loss, pick_output
    from .mid_models import MID_MODELS
    from .models import MODELS

    torch.set_num_threads(threads)
    d = Path(export_dir)
    meta = load_export(d)
    spec = {**MODELS, **MID_MODELS}.get(meta["model"])
    if spec is None:
        raise BenchError(f"{d}: model `{meta['model']}` is not in the corpus registry")
    if device != "cpu" and world > 1:
        raise BenchError("--device cuda times one rank only")
    if world > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        tdist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = spec.factory()
        load_params(model, load_tensors(d / "params.safetensors"))
        model.to(device)
        model.train()
        ddp_model = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        data = [
            ({k: v.to(device) for k, v in args.items()}, None if t is None else t.to(device))
            for args, t in batches_of(load_tensors(d / "data.safetensors"), rank)
        ]
        losses = []

        def sync() -> None:
            if device != "cpu":
                torch.cuda.synchronize()

        def step(i: int) -> None:
            args, targets = data[i % len(data)]
            opt.zero_grad(set_to_none=True)
            # By keyword: data.safetensors holds arguments by name, not by position.
            out = pick_output(ddp_model(**args), meta["output"])
            loss = compute_loss(meta["loss"], out, targets)
            loss.backward()
            opt.step()
            # kept on the device: reading it back each step would time the round trip
            losses.append(loss.detach())

        for i in range(warmup):
            step(i)
        if world > 1:
            tdist.barrier()
        sync()
        t0 = time.perf_counter()
        for i in range(steps):
            step(warmup + i)
        if world > 1:
            tdist.barrier()
        sync()
        dt = time.perf_counter() - t0
        losses = [float(x) for x in losses]
        if rank == 0:
            import resource

            # peak resident memory of this rank's process (KiB on Linux)
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            Path(result_dir, "r.json").write_text(
                json.dumps({"seconds": dt, "first_loss": losses[0], "last_loss": losses[-1], "max_rss": rss})
            )
    finally:
        if world > 1:
            tdist.destroy_process_group()


def bench_one(export_dir: Path, world: int, warmup: int, steps: int, threads: int = 1, device: str = "cpu") -> dict:
    import torch.multiprocessing as mp

    from .exporter import free_port

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            _worker,
            args=(world, free_port(), str(export_dir), warmup, steps, tmp, threads, device),
            nprocs=world,
            join=True,
            start_method="spawn",
        )
        r = json.loads(Path(tmp, "r.json").read_text())
    return {
        "steps_per_s": steps / r["seconds"],
        "step_ms": 1e3 * r["seconds"] / steps,
        "first_loss": r["first_loss"],
        "last_loss": r["last_loss"],
        "max_rss_bytes": r["max_rss"],
    }


def plain_exports(roots: list[Path]) -> list[Path]:
    dirs = set()
    for root in roots:
        if (root / "export.json").is_file():
            dirs.add(root)
        else:
            dirs.update(p.parent for p in root.rglob("export.json"))
    out = []
    for d in sorted(dirs):
        if load_export(d).get("world_size") is None:
            out.append(d)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tracepass.export.bench_torch", description=__doc__.split("\n")[0])
    ap.add_argument("roots", nargs="+", type=Path, help="export directories or folders holding them")
    ap.add_argument("--ranks", default="1,2,4", help="world sizes, comma-separated")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per process")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where one rank trains")
    ap.add_argument(
        "--init-params",
        action="store_true",
        help="first write a missing params.safetensors from the model's own initialisation (seed 0)",
    )
    a = ap.parse_args(argv)

    import torch

    try:
        worlds = [int(x) for x in a.ranks.split(",") if x]
    except ValueError:
        ap.error(f"--ranks: not a comma-separated list of integers: {a.ranks}")
    if not worlds or min(worlds) < 1:
        ap.error("--ranks needs world sizes of at least 1")
    dirs = plain_exports(a.roots)
    if not dirs:
        print(f"error: no plain export directory under {', '.join(map(str, a.roots))}", file=sys.stderr)
        return 1
    if a.init_params:
        for d in dirs:
            if not (d / "params.safetensors").exists():
                try:
                    print(f"wrote {init_params(d)}")
                except BenchError as e:
                    print(f"error: {e}", file=sys.stderr)
                    return 1
    if a.device != "cpu" and worlds != [1]:
        ap.error("--device cuda times one rank: pass --ranks 1")
    results = []
    load_start = os.getloadavg()[0]
    print(f"{'model':<12} {'ranks':>5} {'steps/s':>9} {'ms/step':>9} {'loss0':>8} {'loss_end':>8}")
    for d in dirs:
        for w in worlds:
            try:
                r = bench_one(d, w, a.warmup, a.steps, a.threads, a.device)
            except BenchError as e:
                print(f"error: {d}: {e}", file=sys.stderr)
                return 1
            r = {"export": d.name, "model": load_export(d)["model"], "world_size": w, **r}
            results.append(r)
            print(
                f"{d.name:<12} {w:>5} {r['steps_per_s']:>9.1f} {r['step_ms']:>9.2f} "
                f"{r['first_loss']:>8.4f} {r['last_loss']:>8.4f}",
                flush=True,
            )
    doc = {
        "what": f"PyTorch eager (1 rank, on {a.device}) and DistributedDataParallel (gloo) training steps/s, "
        f"one process per rank, torch.set_num_threads({a.threads}), AdamW lr 1e-3, each export's own batches",
        "torch": torch.__version__.split("+")[0],
        "python": platform.python_version(),
        "cpu": _cpu_name(),
        "cpus": os.cpu_count(),
        "warmup_steps": a.warmup,
        "timed_steps": a.steps,
        "loadavg": f"{load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end",
        "results": results,
    }
    if a.json:
        a.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    sys.exit(main())
