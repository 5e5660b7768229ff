"""Steps per second of data-parallel training on CPU gloo ranks, three ways in one run:
tracepass inside Thunder (`tracepass.thunder.ddp`), Thunder's own DDP
(`thunder.distributed.ddp`) and PyTorch DDP (`DistributedDataParallel`).

    python -m tracepass.bench [--worlds 2,4] [--models nanogpt,llama,bert,cnn,mlp-frozen] [--steps 10] [--rounds 5]

Per world size, model and way: the step rate (forward, backward, AdamW step; the slowest rank)
and the exposed communication per step: the step time minus the step time of the same model
under `no_sync()` (no communication at all), i.e. what communication adds to a step. The ways
are timed in interleaved rounds and each keeps its best round, so they share the machine's load
and a disturbed round drops out. Not a test: timings on a shared machine vary;
`python/tests/test_thunder_ddp.py` checks correctness.
The helpers here (`run_ranks`, `make`, `MODELS`) are the tests' too.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import torch

__all__ = ["MODELS", "BenchModel", "make", "run_ranks", "main"]


def _corpus():
    """The exporter's corpus models and its loss helpers (`tracepass.export`)."""
    from .export import exporter, models

    return exporter, models


class WideMlp(torch.nn.Module):
    """Three Linear(512, 512): 1 MiB weights, so 1 MiB buckets hold one layer each."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(512, 512)
        self.fc2 = torch.nn.Linear(512, 512)
        self.fc3 = torch.nn.Linear(512, 512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))))


def _wide_batch(gen: torch.Generator):
    x = torch.randn(8, 512, generator=gen)
    return OrderedDict(x=x), torch.randint(0, 512, (8,), generator=gen)


@dataclass(frozen=True)
class BenchModel:
    """A model of the corpus: how to build it and the loss of one rank's batch at one step."""

    name: str
    factory: Callable[[], torch.nn.Module]
    batch: Callable[[torch.Generator], Any]
    loss_kind: str = "cross_entropy"
    output: int = 0

    def loss(self, model, step: int, rank: int) -> torch.Tensor:
        exporter, _ = _corpus()
        gen = torch.Generator().manual_seed(1000 * step + rank)
        args, targets = self.batch(gen)
        out = exporter.pick_output(model(*args.values()), self.output)
        return exporter.compute_loss(self.loss_kind, out, targets)


class _Models(dict):
    """Name -> BenchModel, filled from the corpus on first use (it imports Thunder's models)."""

    def _fill(self) -> None:
        if dict.__len__(self):
            return
        _, models = _corpus()
        for name in ("nanogpt", "llama", "bert", "cnn", "mlp-frozen"):
            s = models.MODELS[name]
            dict.__setitem__(self, name, BenchModel(name, s.factory, s.batch, s.loss, s.output))
        dict.__setitem__(self, "wide-mlp", BenchModel("wide-mlp", WideMlp, _wide_batch))

    def __getitem__(self, k):
        self._fill()
        return dict.__getitem__(self, k)

    def keys(self):
        self._fill()
        return dict.keys(self)


MODELS = _Models()


def make(name: str) -> torch.nn.Module:
    """A fresh instance of `name`, the same parameters on every rank and every call."""
    torch.manual_seed(0)
    model = MODELS[name].factory()
    model.train()
    return model


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, out_dir: str, fn, args) -> None:
    import torch.distributed as tdist

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    tdist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        result = fn(rank, world, *args)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
        tdist.barrier()
    finally:
        tdist.destroy_process_group()


def run_ranks(world: int, fn, *args) -> list:
    """Runs `fn(rank, world, *args)` on `world` gloo ranks (spawned processes, one thread each)
    and returns each rank's result. `fn` must be importable (module level)."""
    import torch.multiprocessing as mp

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            _rank_main,
            args=(world, _free_port(), tmp, fn, args),
            nprocs=world,
            join=True,
            start_method="spawn",
        )
        return [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(world)]


# ---- the benchmark ----------------------------------------------------------------------------

WAYS = ("tracepass", "thunder", "pytorch")


def _wrap(way: str, name: str):
    import thunder
    import thunder.distributed

    model = make(name)
    if way == "pytorch":
        dm = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
        return dm, dm.no_sync
    if way == "thunder":
        dm = thunder.distributed.ddp(thunder.jit(model))
    else:
        import tracepass.thunder as tt

        dm = tt.ddp(thunder.jit(model))
    return dm, dm.no_sync


def _timed_steps(dm, opt, spec: BenchModel, rank: int, steps: int, start: int) -> float:
    import torch.distributed as tdist

    tdist.barrier()
    t0 = time.perf_counter()
    for s in range(start, start + steps):
        opt.zero_grad(set_to_none=False)
        spec.loss(dm, s, rank).backward()
        opt.step()
    return time.perf_counter() - t0


def _bench_worker(rank: int, world: int, models: list[str], steps: int, warmup: int, rounds: int) -> dict:
    """Per model: the three ways built and compiled (synchronized and `no_sync` backwards) first,
    then `rounds` rounds that each time every way, synchronized and local, for `steps` steps.
    Interleaving the ways round by round lets them share whatever load the machine has; the
    rounds' times come back whole (the best round is taken across ranks)."""
    out: dict = {}
    for name in models:
        spec = MODELS[name]
        built = {}
        for way in WAYS:
            dm, no_sync = _wrap(way, name)
            opt = torch.optim.AdamW(dm.parameters(), lr=1e-4)
            _timed_steps(dm, opt, spec, rank, warmup, 0)  # compiles, warms caches
            with no_sync():
                _timed_steps(dm, opt, spec, rank, warmup, 0)  # compiles the no-sync backward
            built[way] = (dm, no_sync, opt)
        times: dict = {way: ([], []) for way in WAYS}
        for r in range(rounds):
            # a different way first in each round: none always runs right after a compile
            for way in WAYS[r % len(WAYS) :] + WAYS[: r % len(WAYS)]:
                dm, no_sync, opt = built[way]
                times[way][0].append(_timed_steps(dm, opt, spec, rank, steps, warmup))
                with no_sync():
                    times[way][1].append(_timed_steps(dm, opt, spec, rank, steps, warmup))
        for way in WAYS:
            out[(name, way)] = times[way]
        del built
        if rank == 0:
            print(f"world {world}: {name} measured", file=sys.stderr, flush=True)
    return out


def bench(
    worlds: list[int], models: list[str], steps: int, warmup: int, rounds: int = 5, on_world=None
) -> list[dict]:
    """Rows of (world, model, way, steps/s, exposed comm ms/step); `on_world(rows)` is called
    after each world size with all rows so far (a long run shows its first results early).

    A round's time is its slowest rank's (each timed run starts at a barrier); a way's time is
    its best round, the one least disturbed by anything else running on the machine."""
    rows = []
    for world in worlds:
        per_rank = run_ranks(world, _bench_worker, models, steps, warmup, rounds)
        for name in models:
            for way in WAYS:
                synced = min(max(r[(name, way)][0][i] for r in per_rank) for i in range(rounds))
                local = min(max(r[(name, way)][1][i] for r in per_rank) for i in range(rounds))
                rows.append(
                    {
                        "world": world,
                        "model": name,
                        "way": way,
                        "steps_per_s": steps / synced,
                        "exposed_comm_ms": max(0.0, (synced - local) / steps * 1e3),
                        "comm_share": max(0.0, (synced - local) / synced),
                    }
                )
        if on_world is not None:
            on_world(rows)
    return rows


def table(rows: list[dict]) -> str:
    """Markdown: one line per (world, model), the three ways side by side, and the share of
    Thunder's DDP step that is exposed communication (the benchmark's target applies where it
    is at least 10%)."""
    head = (
        "| world | model | "
        + " | ".join(f"{w} steps/s" for w in WAYS)
        + " | "
        + " | ".join(f"{w} exposed comm ms/step" for w in WAYS)
        + " | thunder comm share |"
    )
    lines = [head, "|" + "---|" * (3 + 2 * len(WAYS))]
    keys = list(OrderedDict.fromkeys((r["world"], r["model"]) for r in rows))
    for world, model in keys:
        by = {r["way"]: r for r in rows if r["world"] == world and r["model"] == model}
        lines.append(
            f"| {world} | {model} | "
            + " | ".join(f"{by[w]['steps_per_s']:.1f}" for w in WAYS)
            + " | "
            + " | ".join(f"{by[w]['exposed_comm_ms']:.2f}" for w in WAYS)
            + f" | {100 * by['thunder']['comm_share']:.0f}% |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tracepass.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", default="2,4", help="world sizes, comma separated (default 2,4)")
    ap.add_argument("--models", default="nanogpt,llama,bert,cnn,mlp-frozen", help="corpus models")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per round and way (default 10)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds; the best one counts (default 5)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    a = ap.parse_args(argv)
    worlds = [int(w) for w in a.worlds.split(",") if w]
    models = [m for m in a.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS.keys()]
    if unknown or any(w < 2 for w in worlds) or a.steps < 1 or a.rounds < 1:
        ap.error(f"unknown models {unknown}; valid: {', '.join(MODELS.keys())}; worlds >= 2; steps, rounds >= 1")
    def partial(rows: list[dict]) -> None:
        if len(worlds) > 1 and rows[-1]["world"] != worlds[-1]:
            print(f"(world sizes so far)\n{table(rows)}\n", file=sys.stderr, flush=True)

    rows = bench(worlds, models, a.steps, a.warmup, a.rounds, on_world=partial)
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
