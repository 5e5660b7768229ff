"""Thunder's OpInfo database as tracepass's op corpus.

    python -m tracepass.export.opinfo --out testdata/opinfo [--ops add,topk] [--samples 2]

Thunder lists every op it supports in `thunder.tests.opinfos`, each with sample inputs. For each
op and each dtype of `DTYPES` the op supports this jits the op on one sample (CPU; float32's
first sample, the first that fits `MAX_SAMPLE_BYTES` for the other dtypes; float inputs with
gradients, integer and bool samples without), runs the forward and, where an output is
differentiable, the backward with seeded cotangents, and writes one directory per sample:

    <op>/<dtype>-<k>/forward.trace       Thunder's final forward trace
    <op>/<dtype>-<k>/backward.trace      its final backward trace (absent without gradients)
    <op>/<dtype>-<k>/inputs.safetensors  the forward's arguments by trace name, and
                                         `cotangents.<i>` for output i of the op
    <op>/<dtype>-<k>/expected.safetensors  PyTorch's `output.<i>` and `grad.<arg>`

`index.json` lists every sample (and every op or dtype Thunder could not jit, with Thunder's
error). PyTorch's numbers come from the OpInfo's `torch_reference` on the same inputs and
cotangents; where an op has none (or it disagrees with the op's outputs in structure), from
Thunder's own run, and `index.json` says so (`"reference": "thunder"`).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from .exporter import portable_source_paths

# the dtypes a sample is made in: (torch dtype, file tag, samples per op, with gradients)
DTYPES = (
    (torch.float32, "f32", 1, True),
    (torch.float64, "f64", 1, True),
    (torch.bfloat16, "bf16", 1, True),
    (torch.float16, "f16", 1, True),
    (torch.int64, "i64", 1, False),
    (torch.int32, "i32", 1, False),
    (torch.bool, "b8", 1, False),
)
DEFAULT_TAGS = ",".join(tag for _, tag, _, _ in DTYPES)
SEED = 1234
# float32 samples with larger inputs are skipped, so the checked-in corpus stays a few MB; the
# other dtypes take the op's first sample under `SMALL_SAMPLE_BYTES` (of the first
# `SAMPLES_LOOKED_AT`), so seven dtypes stay within about 20 MB
MAX_SAMPLE_BYTES = 1 << 20
SMALL_SAMPLE_BYTES = 64 << 10
SAMPLES_LOOKED_AT = 16


def _thunder_dtype(d: torch.dtype):
    import thunder

    return thunder.dtypes.to_dtype(d)


def _trace_args(text: str) -> list[str]:
    m = re.search(r"^def computation\(([^)]*)\):", text, re.M)
    if not m:
        raise ValueError("the forward trace has no `def computation(...)` line")
    return [a.strip() for a in m.group(1).split(",") if a.strip()]


def _short(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    first = msg[0] if msg else ""
    return f"{type(e).__name__}: {first[:300]}"


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [x for x in pytree.tree_leaves(tree) if isinstance(x, torch.Tensor)]


def _rebuild(tree: Any, tensors: list[torch.Tensor]) -> Any:
    """`tree` with its tensor leaves replaced, in order, by `tensors`."""
    leaves, spec = pytree.tree_flatten(tree)
    it = iter(tensors)
    return pytree.tree_unflatten([next(it) if isinstance(x, torch.Tensor) else x for x in leaves], spec)


def _leaf_copies(tensors: list[torch.Tensor], grad: bool) -> list[torch.Tensor]:
    out = []
    for t in tensors:
        c = t.detach().clone()
        if grad and c.is_floating_point():
            c.requires_grad_(True)
        out.append(c)
    return out


def _differentiable(outs: list[torch.Tensor]) -> list[int]:
    return [i for i, o in enumerate(outs) if o.requires_grad and o.is_floating_point()]


def _cotangents(outs: list[torch.Tensor]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(SEED)
    cots = []
    for o in outs:
        if o.is_floating_point():
            cots.append(torch.randn(o.shape, generator=g, dtype=torch.float32).to(o.dtype))
        else:
            cots.append(torch.zeros(o.shape, dtype=o.dtype))
    return cots


def _grads(outs, cots, inputs) -> list[torch.Tensor | None]:
    diff = _differentiable(outs)
    wants = [t for t in inputs if t.requires_grad]
    if not diff or not wants:
        return [None] * len(inputs)
    got = torch.autograd.grad([outs[i] for i in diff], wants, [cots[i] for i in diff], allow_unused=True)
    it = iter(got)
    return [next(it) if t.requires_grad else None for t in inputs]


def _contig(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().clone()


def _thunder_tolerance(op, dtype: torch.dtype) -> dict[str, float]:
    """The wider `rtol` / `atol` Thunder's own consistency test allows `op` in `dtype` on the
    CPU (a `custom_comparator` of `assert_close` among its test directives), if any."""
    from thunder.core import devices
    from thunder.tests.framework import custom_comparator

    td = _thunder_dtype(dtype)
    for d in getattr(op, "test_directives", ()) or ():
        comp = getattr(d, "decorator", None)
        if not isinstance(comp, custom_comparator) or not d.active_if:
            continue
        if d.test_template_name not in (None, "test_core_vs_torch_consistency"):
            continue
        if d.devicetypes is not None and devices.DeviceType.CPU not in d.devicetypes:
            continue
        if d.dtypes is not None and td not in d.dtypes:
            continue
        kw = getattr(comp.comparator, "keywords", None) or {}
        tol = {k: float(kw[k]) for k in ("rtol", "atol") if k in kw}
        if tol:
            return tol
    return {}


def _sample_bytes(sample) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors((sample.args, sample.kwargs)))


def probe_sample(op, sample, dtype_tag: str, grad: bool, out_dir: Path) -> dict[str, Any]:
    """Jits one sample, writes its directory; returns its `index.json` entry."""
    import thunder
    from safetensors.torch import save_file

    args, kwargs = sample.args, sample.kwargs
    leaves = _tensors((args, kwargs))
    size = _sample_bytes(sample)
    if size > MAX_SAMPLE_BYTES:
        raise ValueError(f"skipped: the sample's tensors are over the probe's 1 MB cap ({size} bytes)")
    entry: dict[str, Any] = {"op": op.name, "dtype": dtype_tag, "dir": out_dir.name}
    entry.update(_thunder_tolerance(op, next(d for d, t, _, _ in DTYPES if t == dtype_tag)))

    def call(*ts):
        a, k = _rebuild((args, kwargs), list(ts))
        return op.op(*a, **k)

    th_in = _leaf_copies(leaves, grad)
    torch.manual_seed(SEED)
    jf = thunder.jit(call)
    out = jf(*th_in)
    th_out = _tensors(out)
    cots = _cotangents(th_out)
    th_grads = _grads(th_out, cots, th_in) if grad else [None] * len(th_in)
    fwd = portable_source_paths(str(thunder.last_traces(jf)[-1]))
    bws = thunder.last_backward_traces(jf) if grad and _differentiable(th_out) else []
    names = _trace_args(fwd)
    # Thunder folds some ops to a constant (`isfinite` of an integer): the trace takes nothing
    traced = [] if not names and not bws else leaves
    if len(names) != len(traced):
        raise ValueError(f"the forward takes {len(names)} arguments for {len(leaves)} tensors")

    # PyTorch's numbers: the OpInfo's torch reference on the same inputs and cotangents
    reference = "torch"
    ref_out, ref_grads = th_out, th_grads
    if op.torch_reference is not None:
        try:
            ref_in = _leaf_copies(leaves, grad)
            a, k = _rebuild((args, kwargs), ref_in)
            torch.manual_seed(SEED)
            r = _tensors(op.torch_reference(*a, **k))
            if [x.shape for x in r] != [x.shape for x in th_out]:
                raise ValueError("the reference's outputs differ in shape")
            ref_grads = _grads(r, cots, ref_in) if grad else [None] * len(ref_in)
            ref_out = r
        except Exception as e:  # noqa: BLE001 - any failure falls back to Thunder's numbers
            reference, entry["reference_error"] = "thunder", _short(e)
            ref_out, ref_grads = th_out, th_grads
    else:
        reference = "thunder"
    entry["reference"] = reference

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "forward.trace").write_text(fwd)
    inputs = {n: _contig(t) for n, t in zip(names, traced)}
    if bws:
        (out_dir / "backward.trace").write_text(portable_source_paths(str(bws[-1])))
        for i, c in enumerate(cots):
            inputs[f"cotangents.{i}"] = _contig(c)
    expected = {f"output.{i}": _contig(o) for i, o in enumerate(ref_out)}
    if bws:
        for n, g in zip(names, ref_grads):
            if g is not None:
                expected[f"grad.{n}"] = _contig(g)
    save_file(inputs, str(out_dir / "inputs.safetensors"))
    save_file(expected, str(out_dir / "expected.safetensors"))
    entry["backward"] = bool(bws)
    return entry


def _samples(op, dtype, tag: str, grad: bool):
    """The op's samples in `dtype`: all of them for float32 (over the cap they fail), for the
    other dtypes those under `SMALL_SAMPLE_BYTES` among the first `SAMPLES_LOOKED_AT`."""
    gen = op.sample_input_generator(op, torch.device("cpu"), dtype, grad)
    if tag == "f32":
        yield from gen
        return
    small = False
    for looked, sample in enumerate(gen):
        if looked >= SAMPLES_LOOKED_AT:
            break
        if _sample_bytes(sample) <= SMALL_SAMPLE_BYTES:
            small = True
            yield sample
    if not small:
        raise ValueError(
            f"skipped: none of the first {SAMPLES_LOOKED_AT} samples is under the probe's "
            f"{SMALL_SAMPLE_BYTES >> 10} KB cap"
        )


def _probe_dtype(index: dict[str, Any], out: Path, op, dtype, tag: str, count: int, grad: bool) -> None:
    """Probes up to `count` samples of `op` in `dtype` into `index`."""
    try:
        taken = 0
        for sample in _samples(op, dtype, tag, grad):
            d = out / op.name / f"{tag}-{taken}"
            try:
                index["samples"].append(probe_sample(op, sample, tag, grad, d))
            except Exception as e:  # noqa: BLE001 - Thunder's error is the datum
                shutil.rmtree(d, ignore_errors=True)
                # an op Thunder has no gradient for is still jitted without one
                try:
                    if not grad:
                        raise
                    entry = probe_sample(op, sample, tag, False, d)
                    entry["grad_error"] = _short(e)
                    index["samples"].append(entry)
                except Exception:  # noqa: BLE001
                    shutil.rmtree(d, ignore_errors=True)
                    index["failures"].append({"op": op.name, "dtype": tag, "sample": taken, "error": _short(e)})
            taken += 1
            if taken >= count:
                break
    except Exception as e:  # noqa: BLE001 - a generator that fails is one failure
        index["failures"].append({"op": op.name, "dtype": tag, "sample": None, "error": _short(e)})


def probe(
    out: Path, only: set[str] | None, samples_cap: int | None, tags: set[str], part: tuple[int, int] = (0, 1)
) -> dict[str, Any]:
    """Probes every op (or those of `only`) whose position in the database is `k` mod `n`
    for `part = (k, n)`; writes `index.json` (`index.part<k>.json` for one part of several,
    which `merge` joins) after each op, so a stopped run keeps what it did."""
    import thunder
    from thunder.tests.opinfos import opinfos

    warnings.filterwarnings("ignore")
    k, n = part
    extra = n == 0
    if n == 1 and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    index_path = out / ("index.json" if n == 1 else "index.extra.json" if extra else f"index.part{k}.json")
    index: dict[str, Any] = {
        "thunder": thunder.__version__,
        "torch": torch.__version__.split("+")[0],
        "ops": 0,
        "samples": [],
        "failures": [],
        "tried": [],
    }
    seen: set[str] = set()
    for pos, op in enumerate(opinfos):
        if only and op.name not in only:
            continue
        if not extra and pos % n != k:
            continue
        if op.name in seen:  # a few OpInfos share a name; the first one stands
            continue
        seen.add(op.name)
        index["ops"] += 1
        supported = op.dtypes()
        for dtype, tag, count, grad in DTYPES:
            if tag not in tags or _thunder_dtype(dtype) not in supported:
                continue
            index["tried"].append([op.name, tag])
            if samples_cap is not None:
                count = samples_cap
            if tag == "f32":
                _probe_dtype(index, out, op, dtype, tag, count, grad)
            else:
                # the other dtypes draw from their own seeded generator, so float32's samples
                # are the same with or without them
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(SEED)
                    _probe_dtype(index, out, op, dtype, tag, count, grad)
        print(f"{op.name}: {sum(1 for s in index['samples'] if s['op'] == op.name)} samples", file=sys.stderr)
        index_path.write_text(json.dumps(index, indent=1) + "\n")
    index_path.write_text(json.dumps(index, indent=1) + "\n")
    return index


def _pairs(index: dict[str, Any]) -> set[tuple[str, str]]:
    """The (op, dtype) pairs a run tried (an index from before `tried`: those it lists)."""
    if "tried" in index:
        return {(o, t) for o, t in index["tried"]}
    return {(s["op"], s["dtype"]) for s in index["samples"] + index["failures"]}


def merge(out: Path) -> dict[str, Any]:
    """Joins the `index.part<k>.json` of a run split in parts, and `index.extra.json` (a rerun
    of some ops), into `index.json`. A part or rerun replaces the (op, dtype) pairs it tried
    and keeps the others, so a run of new dtypes adds to the corpus already there."""
    parts = sorted(out.glob("index.part*.json")) + sorted(out.glob("index.extra.json"))
    base = out / "index.json"
    if not parts and not base.exists():
        raise SystemExit(f"error: no index.part*.json or index.json in {out}")
    index: dict[str, Any] = json.loads(base.read_text()) if base.exists() else {}
    if index:
        index["tried"] = sorted(_pairs(index))
    new_ops = 0
    for p in parts:
        part = json.loads(p.read_text())
        new_ops += part["ops"] if p.name != "index.extra.json" else 0
        if not index:
            index = {**part, "samples": [], "failures": [], "tried": []}
        redone = _pairs(part)
        keep = lambda e: (e["op"], e["dtype"]) not in redone  # noqa: E731
        index["samples"] = [s for s in index["samples"] if keep(s)] + part["samples"]
        index["failures"] = [f for f in index["failures"] if keep(f)] + part["failures"]
        index["tried"] = sorted((set(map(tuple, index["tried"])) - redone) | redone)
        p.unlink()
    index["ops"] = max(index["ops"], new_ops, len({o for o, _ in map(tuple, index["tried"])}))
    index["tried"] = [list(t) for t in sorted(set(map(tuple, index["tried"])))]
    index["samples"].sort(key=lambda s: (s["op"], s["dir"]))
    index["failures"].sort(key=lambda f: (f["op"], f["dtype"]))
    (out / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    return index


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tracepass.export.opinfo", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder to (re)write, e.g. testdata/opinfo")
    ap.add_argument("--ops", help="only these OpInfo names, comma separated")
    ap.add_argument(
        "--samples",
        type=int,
        help="this many samples per op and dtype (default one; float32 takes them in order, "
        "the other dtypes the small ones among the first 16)",
    )
    ap.add_argument("--dtypes", default=DEFAULT_TAGS, help=f"dtype tags to make samples in ({DEFAULT_TAGS})")
    ap.add_argument(
        "--part",
        help="K/N: only the ops at positions K mod N (run N of these side by side); "
        "`extra`: rerun --ops into an existing folder (--merge puts them in place)",
    )
    ap.add_argument("--merge", action="store_true", help="join the index.part*.json of a split run")
    a = ap.parse_args(argv)
    if a.merge:
        index = merge(a.out)
        print(f"{index['ops']} ops, {len(index['samples'])} samples", file=sys.stderr)
        return 0
    only = set(a.ops.split(",")) if a.ops else None
    part = (0, 1)
    if a.part == "extra":
        part = (0, 0)
    elif a.part:
        k, n = (int(x) for x in a.part.split("/"))
        if not 0 <= k < n:
            ap.error(f"--part {a.part}: K must be in 0..N")
        part = (k, n)
    index = probe(a.out, only, a.samples, set(a.dtypes.split(",")), part)
    print(
        f"{index['ops']} ops, {len(index['samples'])} samples jitted, {len(index['failures'])} failures",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
