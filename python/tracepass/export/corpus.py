"""Regenerate the corpus: every registry model, plain and `-ddp` (2 ranks), plus README.md and VOCAB.md.

    python -m tracepass.export.corpus --out testdata/models [--models nanogpt,cnn] [--ddp 2]

`cargo xtask corpus` runs this. A model that Thunder cannot trace is reported (and listed in the
README) instead of stopping the rest; the exit status is 1 if any failed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import traceback
from pathlib import Path

from .vocab import markdown, vocab

PINNED = {"torch": "2.9.0", "thunder": "0.2.6"}


def describe(d: Path) -> dict:
    """Numbers for the README table, read back from the written export."""
    from safetensors import safe_open

    meta = json.loads((d / "export.json").read_text())
    tied_extra = {n for group in meta["tied"] for n in sorted(group)[1:]}

    def numel(shape: list[int]) -> int:
        size = 1
        for s in shape:
            size *= s
        return size

    with safe_open(str(d / "params.safetensors"), "pt") as f:
        # Every parameter and buffer, a tie counted once.
        n_state = sum(numel(f.get_slice(k).get_shape()) for k in f.keys() if k not in tied_extra)
    with safe_open(str(d / "reference" / "grads.safetensors"), "pt") as g:
        # Trainable parameters: the ones eager PyTorch gave a gradient (a tie under one name).
        n_params = sum(numel(g.get_slice(k).get_shape()) for k in g.keys())
    with safe_open(str(d / "data.safetensors"), "pt") as f:
        data = {}
        for k in f.keys():
            arg, _, _ = k.rsplit(".", 2)
            if arg != "targets" and arg not in data:
                sl = f.get_slice(k)
                data[arg] = f"{sl.get_dtype().lower()}{sl.get_shape()}"
        steps = len({k.rsplit(".", 2)[1] for k in f.keys()})
        ranks = len({k.rsplit(".", 2)[2] for k in f.keys()})
    ref = json.loads((d / "reference" / "loss.json").read_text())
    check = json.loads((d / "reference" / "thunder_check.json").read_text())
    return {
        "trainable": n_params,
        "state": n_state,
        "data": data,
        "steps": steps,
        "ranks": ranks,
        "eager_loss": ref["losses"][0],
        "thunder_loss": check["thunder_loss"],
        "grad_err": check["grad_max_rel_err"],
        "near_zero": check.get("near_zero_grads", []),
        "deterministic": ref["deterministic"],
        "bytes": sum(p.stat().st_size for p in d.rglob("*") if p.is_file()),
    }


def timing_line(d: Path) -> str | None:
    p = d / "reference" / "thunder_timing.json"
    if not p.is_file():
        return None
    t = json.loads(p.read_text())
    if not t.get("world_size"):
        return None
    tt = t["ddp_trace_transforms"]
    return (
        f"| {d.name} | {t['plain_thunder']['total_s']:.2f} | {t['thunder']['total_s']:.2f} | "
        f"{t['thunder']['ddp_wrap_s'] * 1e3:.1f} | {tt['ddp_pass']['s'] * 1e3:.1f} | "
        f"{tt['bucketing_all_reduce']['s'] * 1e3:.1f} | {tt['sort_waits']['s'] * 1e3:.1f} | "
        f"{t['ddp_trace_transforms_total_s'] * 1e3:.1f} | {t['thunder'].get('repeats', 1)} |"
    )


def baseline_table(path: Path) -> list[str]:
    """The PyTorch baselines of torch_baseline.json (bench_torch), steps/s by model and ranks."""
    if not path.is_file():
        return []
    doc = json.loads(path.read_text())
    worlds = sorted({r["world_size"] for r in doc["results"]})
    by_model: dict[str, dict[int, float]] = {}
    for r in doc["results"]:
        by_model.setdefault(r["export"], {})[r["world_size"]] = r["steps_per_s"]
    lines = [
        "",
        "## PyTorch baselines (torch_baseline.json, steps/s)",
        "",
        f"`python -m tracepass.export.bench_torch testdata/models --json testdata/models/torch_baseline.json`:",
        f"{doc['what']}; {doc['timed_steps']} steps timed after {doc['warmup_steps']}, on {doc['cpus']} CPUs"
        f" ({doc['cpu']}){'; load average ' + doc['loadavg'] if doc.get('loadavg') else ''}.",
        "",
        "| export | " + " | ".join(f"{w} rank{'s' if w > 1 else ''}" for w in worlds) + " |",
        "|---|" + "---:|" * len(worlds),
    ]
    for name, row in sorted(by_model.items()):
        lines.append(f"| {name} | " + " | ".join(f"{row[w]:.1f}" if w in row else "" for w in worlds) + " |")
    return lines


def readme(out: Path, done: list[str], failed: dict[str, str]) -> str:
    from .models import MODELS

    lines = [
        "# The model corpus: real Thunder exports (format: ../../docs/EXPORT_FORMAT.md)",
        "",
        "Made by `cargo xtask corpus` (which runs `python -m tracepass.export.corpus --out testdata/models`)",
        "with lightning-thunder 0.2.6 and torch 2.9.0 on CPU, float32 (`python/requirements.txt`). Each model",
        "is built from code or a config with random init (seed 0, no downloaded weights), jitted with",
        "`thunder.jit(model)` and run for one forward and backward; the loss (`F.cross_entropy` of the",
        "output against integer targets) is computed outside the jitted model. `-ddp` directories come",
        "from `thunder.distributed.ddp(thunder.jit(model))` on 2 gloo ranks, rank 0's traces; their",
        "backward holds Thunder's own all-reduces. Traces are Thunder's, unchanged except that the paths",
        "of source-location comments are cut to `site-packages/...` or `python/...`.",
        "",
        "Data: plain exports hold 4 steps x 4 ranks of batches (`<arg>.<step>.<rank>`), `-ddp` ones",
        "4 steps x 2 ranks. `reference/`: eager PyTorch's loss and gradients (step 0, rank 0's batch),",
        "`thunder_check.json` (Thunder's loss and gradients against eager's: rank 0's batch for plain",
        "exports, the mean over both ranks' batches for `-ddp` ones, after Thunder's all-reduce) and",
        "`thunder_timing.json` (Thunder's compile times; for `-ddp`, its DDP transform).",
        "",
        "| dir | model | trainable params | params + buffers | data | eager loss | Thunder loss | grad err | size | notes |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    for name in done:
        d = out / name
        s = describe(d)
        base = name[: -len("-ddp")] if name.endswith("-ddp") else name
        spec = MODELS[base]
        data = ", ".join(f"`{k}` {v}" for k, v in s["data"].items())
        notes = list(spec.notes)
        if s["near_zero"]:
            notes.append(
                "gradients zero in exact arithmetic (left out of grad err): " + ", ".join(f"`{n}`" for n in s["near_zero"])
            )
        if name.endswith("-ddp"):
            notes.insert(0, "Thunder DDP, 2 ranks")
        lines.append(
            f"| {name} | {spec.description} | {s['trainable']:,} | {s['state']:,} | {data} | "
            f"{s['eager_loss']:.6f} | {s['thunder_loss']:.6f} | "
            f"{'%.1e' % s['grad_err'] if s['deterministic'] else 'n/a (dropout)'} | {s['bytes'] / 1024:.0f} KiB | "
            f"{'; '.join(notes)} |"
        )
    lines += [
        "",
        "grad err: max over parameters of max |thunder - eager| / max |eager|.",
        "",
        "## Thunder's own DDP transform (seconds on rank 0 of 2; this machine, shared, so noisy)",
        "",
        "`plain` = `thunder.jit` + first forward + backward of the same model in the same process (after",
        "a warm-up on another instance); `ddp` = the same under `thunder.distributed.ddp`. The last four",
        "columns time Thunder's DDP trace transforms alone (wrapped with timers): the `ddp pass` on the",
        "forward, gradient all-reduce bucketing and `sort_waits`. The all-reduces themselves are",
        "inserted inside Thunder's grad transform and are not timed apart. The `ddp` totals include",
        "waiting for the other rank (the broadcast in `ddp()`, the first all-reduce). With `repeats` > 1",
        "(`--timing-repeats`) each column is from the fastest repeat. The corpus was made on 2 cores",
        "shared with other jobs (load average 6-13 for the first corpus run, 3-4 for these `-ddp` timings), so repeats of one export differ by up to 2.6x.",
        "",
        "| export | plain total s | ddp total s | ddp() wrap ms | ddp pass ms | bucketing ms | sort_waits ms | DDP transforms ms | repeats |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [t for t in (timing_line(out / n) for n in done) if t]
    if failed:
        lines += ["", "## Models Thunder could not export", ""]
        lines += [f"- {n}: {why}" for n, why in failed.items()]
    lines += baseline_table(out / "torch_baseline.json")
    lines += ["", "Callees of all traces: VOCAB.md."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from .exporter import export, versions
    from .models import MODELS

    ap = argparse.ArgumentParser(prog="python -m tracepass.export.corpus", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated (default: all)")
    ap.add_argument("--ddp", type=int, default=2, help="ranks of the -ddp exports (0: none)")
    ap.add_argument("--any-version", action="store_true", help="do not insist on the pinned torch/Thunder")
    ap.add_argument("--timing-repeats", type=int, default=1, help="DDP exports: compile N times, keep the fastest")
    ap.add_argument("--readme-only", action="store_true", help="only rewrite README.md and VOCAB.md")
    a = ap.parse_args(argv)

    v = versions()
    if not a.any_version and v != PINNED:
        print(f"error: the corpus is pinned to {PINNED}, this Python has {v} (--any-version to go on)", file=sys.stderr)
        return 1
    names = [m for m in a.models.split(",") if m]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        print(f"error: unknown models {unknown}; valid: {', '.join(MODELS)}", file=sys.stderr)
        return 1
    a.out.mkdir(parents=True, exist_ok=True)
    failed: dict[str, str] = {}
    for m in [] if a.readme_only else names:
        spec = MODELS[m]
        for ddp in [None, a.ddp] if a.ddp else [None]:
            dir_name = f"{m}-ddp" if ddp else m
            print(f"exporting {dir_name} ...", flush=True)
            try:
                s = export(
                    spec.factory,
                    spec.batch,
                    spec.loss,
                    a.out / dir_name,
                    name=m,
                    output=spec.output,
                    ddp=ddp,
                    deterministic=spec.deterministic,
                    timing_repeats=a.timing_repeats,
                )
                print(
                    f"  eager loss {s['eager_loss']:.6f}, Thunder {s['thunder_loss']:.6f}, "
                    f"grad err {s['grad_max_rel_err']:.2e}",
                    flush=True,
                )
            except Exception as e:  # a model Thunder cannot trace is recorded, the rest go on
                traceback.print_exc()
                failed[dir_name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                shutil.rmtree(a.out / dir_name, ignore_errors=True)
    # README and VOCAB describe every export now in the folder (also ones made by earlier runs).
    present = sorted(p.parent.name for p in a.out.glob("*/export.json"))
    (a.out / "README.md").write_text(readme(a.out, present, failed))
    v, dirs = vocab([a.out])
    (a.out / "VOCAB.md").write_text(markdown(v, dirs))
    print(f"wrote {len(present)} exports, README.md and VOCAB.md to {a.out}")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
