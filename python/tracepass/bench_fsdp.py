"""Steps per second and per-rank memory of sharded data-parallel training on CPU gloo ranks:
Thunder's fsdp (`thunder.distributed.fsdp`, ZeRO-2 and ZeRO-3) and PyTorch FSDP2
(`torch.distributed.fsdp.fully_shard`, ZeRO-3 when it reshards after the forward, ZeRO-2 when
it does not), with PyTorch DDP as their reference, on the model `cargo xtask bench fsdp` trains
with tracepass: 8 x (Linear(512, 512) + GELU), batch 8, the sum of the output as the loss,
AdamW.

    python python/tracepass/bench_fsdp.py [--worlds 2,4] [--steps 12] [--warmup 2] [--json]

(or `python -m tracepass.bench_fsdp` where the package is installed). It needs torch and, for
Thunder's rows, lightning-thunder; not tracepass's native module, so that `cargo xtask bench
fsdp` runs it from the source tree: hence its own rank launcher rather than
`tracepass.bench.run_ranks`, whose spawned ranks import the package.

Per world size and way: the step rate (forward, backward, AdamW step; the slowest rank, after
the warm-up steps), the bytes one rank keeps of parameters, gradients and optimizer state
(its local shards: what tracepass's `state_bytes` counts), and the rank process's peak resident
memory (`VmHWM`, the Python interpreter and torch included). A way that cannot run is a row with
its error (Thunder's fsdp on CPU, for one). Not a test: timings on a shared machine vary.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
import traceback

# run as a script, this file's folder (the package's) leads sys.path, where `thunder` would be
# tracepass's own `thunder.py`: Thunder must come from site-packages
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import torch  # noqa: E402

__all__ = ["WAYS", "make_mlp", "main"]

LAYERS, WIDTH, BATCH = 8, 512, 8

WAYS = ("pytorch-ddp", "thunder-fsdp-zero2", "thunder-fsdp-zero3", "fsdp2-zero2", "fsdp2-zero3")


def make_mlp() -> torch.nn.Module:
    """The deep MLP, the same parameters on every rank."""
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU()]
    return torch.nn.Sequential(*layers)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, out_dir: str, args: tuple) -> None:
    import torch.distributed as tdist

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    tdist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(_worker(rank, world, *args), f)
        tdist.barrier()
    finally:
        tdist.destroy_process_group()


def run_ranks(world: int, *args) -> list[dict]:
    """`_worker(rank, world, *args)` on `world` gloo ranks (spawned processes, one thread
    each); each rank's result."""
    import torch.multiprocessing as mp

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            _rank_main,
            args=(world, _free_port(), tmp, args),
            nprocs=world,
            join=True,
            start_method="spawn",
        )
        out = []
        for r in range(world):
            with open(os.path.join(tmp, f"rank{r}.json")) as f:
                out.append(json.load(f))
        return out


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard, or the tensor."""
    return t.to_local() if hasattr(t, "to_local") else t


def _state_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    """This rank's parameters, gradients and optimizer state, as it holds them."""
    n = 0
    for p in model.parameters():
        n += _local(p).numel() * p.element_size()
        if p.grad is not None:
            n += _local(p.grad).numel() * p.grad.element_size()
    for st in opt.state.values():
        for v in st.values():
            if torch.is_tensor(v) and v.dim() > 0:
                n += _local(v).numel() * v.element_size()
    return n


def _wrap(way: str):
    """The model as `way` trains it, and the module whose parameters the optimizer steps."""
    model = make_mlp()
    if way == "pytorch-ddp":
        dm = torch.nn.parallel.DistributedDataParallel(model)
        return dm, dm
    if way.startswith("fsdp2-"):
        from torch.distributed.fsdp import fully_shard

        reshard = way.endswith("zero3")
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, reshard_after_forward=reshard)
        fully_shard(model, reshard_after_forward=reshard)
        return model, model
    # Thunder's fsdp transforms a jitted module; its device defaults to cuda:LOCAL_RANK
    import thunder
    from thunder.distributed import FSDPType, fsdp

    stage = FSDPType.ZERO3 if way.endswith("zero3") else FSDPType.ZERO2
    jm = fsdp(thunder.jit(model), device=torch.device("cpu"), sharding_strategy=stage)
    return jm, jm


def _worker(rank: int, world: int, ways: list[str], steps: int, warmup: int) -> dict:
    import torch.distributed as tdist

    out: dict = {}
    gen = torch.Generator().manual_seed(1000 + rank)
    batches = [torch.randn(BATCH, WIDTH, generator=gen) for _ in range(4)]
    for way in ways:
        tdist.barrier()
        try:
            dm, params = _wrap(way)
            opt = torch.optim.AdamW(params.parameters(), lr=1e-3)
            state = 0
            for s in range(warmup + steps):
                if s == warmup:
                    tdist.barrier()
                    t0 = time.perf_counter()
                opt.zero_grad(set_to_none=False)
                dm(batches[s % len(batches)]).sum().backward()
                if s == warmup + steps - 1:
                    # the gradients are there: the rank at its fullest
                    state = _state_bytes(params, opt)
                opt.step()
            secs = time.perf_counter() - t0
            out[way] = {"secs": secs, "state_bytes": state, "hwm_kib": _status_kib("VmHWM")}
        except Exception as e:  # noqa: BLE001 - a way that cannot run is reported, not fatal
            lines = traceback.format_exception_only(type(e), e)
            out[way] = {"error": "".join(lines).strip().splitlines()[-1][:300]}
            if os.environ.get("TRACEPASS_BENCH_TRACEBACK"):
                traceback.print_exc()
        finally:
            # the other ways' collectives must not meet a rank still in this one
            try:
                tdist.barrier()
            except Exception:  # noqa: BLE001
                pass
    return out


def bench(worlds: list[int], steps: int, warmup: int, ways: list[str]) -> list[dict]:
    rows = []
    for world in worlds:
        per_rank = run_ranks(world, ways, steps, warmup)
        for way in ways:
            rs = [r[way] for r in per_rank]
            errors = [r["error"] for r in rs if "error" in r]
            if errors:
                rows.append({"world": world, "way": way, "error": errors[0]})
                continue
            secs = max(r["secs"] for r in rs)
            rows.append(
                {
                    "world": world,
                    "way": way,
                    "steps_per_s": steps / secs,
                    "state_mib": max(r["state_bytes"] for r in rs) / 2**20,
                    "peak_rss_mib": max(r["hwm_kib"] for r in rs) / 1024,
                }
            )
    return rows


def table(rows: list[dict]) -> str:
    out = [
        "| ranks | way | steps/s | state per rank (MiB) | peak RSS per rank (MiB) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['world']} | {r['way']} | cannot run: {r['error']} | | |")
        else:
            out.append(
                f"| {r['world']} | {r['way']} | {r['steps_per_s']:.1f} | {r['state_mib']:.2f} | {r['peak_rss_mib']:.0f} |"
            )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--ways", default=",".join(WAYS))
    ap.add_argument("--json", action="store_true", help="one JSON row per line")
    a = ap.parse_args(argv)
    ways = [w for w in a.ways.split(",") if w]
    unknown = [w for w in ways if w not in WAYS]
    if unknown:
        ap.error(f"unknown ways {unknown}; valid: {', '.join(WAYS)}")
    rows = bench([int(w) for w in a.worlds.split(",")], a.steps, a.warmup, ways)
    if a.json:
        for r in rows:
            print(json.dumps(r))
    else:
        print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
