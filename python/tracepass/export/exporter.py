"""Write a tracepass export directory (../docs/EXPORT_FORMAT.md) for one model.

`export(model_factory, batch, loss, out_dir, ...)` runs `thunder.jit(model)` (or, with
`ddp=N`, `thunder.distributed.ddp(thunder.jit(model))` on N gloo ranks, rank 0's traces) for one
forward and backward, with the loss computed outside the jitted model, and writes:

- forward.trace, backward.trace, prologue.trace: Thunder's final traces, unchanged;
- params.safetensors: every parameter and buffer by its PyTorch name, before the step;
- data.safetensors: `<arg>.<step>.<rank>` and `targets.<step>.<rank>`;
- export.json;
- reference/loss.json, reference/grads.safetensors: eager PyTorch, step 0, rank 0's batch;
- reference/thunder_check.json: Thunder's loss and gradients against eager's;
- reference/thunder_timing.json: how long Thunder took (jit, DDP transform, first compile).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import tempfile
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

LOSSES = ("cross_entropy", "mse", "sum", "output")
FORMAT = 1
# A reference gradient whose max |g| is below this fraction of the largest one counts as zero.
NEAR_ZERO = 1e-6


class ExportError(RuntimeError):
    """The model, its batch or its traces do not fit the export format."""


# ---- helpers that need no Thunder ------------------------------------------------------------


def compute_loss(kind: str, out: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor:
    """The loss of EXPORT_FORMAT.md, computed outside the traced model."""
    if kind == "cross_entropy":
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), targets.reshape(-1))
    if kind == "mse":
        return F.mse_loss(out, targets)
    if kind == "sum":
        return out.sum()
    if kind == "output":
        return out
    raise ExportError(f"unknown loss `{kind}`; valid: {', '.join(LOSSES)}")


def pick_output(out: Any, index: int) -> torch.Tensor:
    """The model output that feeds the loss: `out` itself, or `out[index]` for a tuple/list."""
    if isinstance(out, torch.Tensor):
        if index != 0:
            raise ExportError(f"model returned one tensor but output index is {index}")
        return out
    if isinstance(out, (tuple, list)):
        if not 0 <= index < len(out):
            raise ExportError(f"output index {index} out of range: the model returned {len(out)} outputs")
        o = out[index]
        if not isinstance(o, torch.Tensor):
            raise ExportError(f"model output {index} is a {type(o).__name__}, not a tensor")
        return o
    raise ExportError(f"model returned a {type(out).__name__}; expected a tensor, tuple or list")


def tied_groups(model: nn.Module) -> list[list[str]]:
    """Parameters that are one tensor, by identity (never by name), each group sorted."""
    by_id: dict[int, list[str]] = OrderedDict()
    for name, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(name)
    return sorted(sorted(names) for names in by_id.values() if len(names) > 1)


def snapshot_state(model: nn.Module) -> "OrderedDict[str, torch.Tensor]":
    """Every parameter and buffer by FQN (ties under each name), detached contiguous copies."""
    state: OrderedDict[str, torch.Tensor] = OrderedDict()
    for name, t in model.named_parameters(remove_duplicate=False):
        state[name] = t.detach().clone().contiguous()
    for name, t in model.named_buffers(remove_duplicate=False):
        state[name] = t.detach().clone().contiguous()
    return state


def make_batches(
    batch_fn: Callable[[torch.Generator], tuple[dict, torch.Tensor]], steps: int, ranks: int, seed: int
) -> dict[tuple[int, int], tuple["OrderedDict[str, torch.Tensor]", torch.Tensor]]:
    """steps x ranks batches from one generator, drawn step-major so a prefix of ranks is stable."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for s in range(steps):
        for r in range(ranks):
            args, targets = batch_fn(gen)
            if not args:
                raise ExportError("the batch has no data argument")
            out[(s, r)] = (OrderedDict(args), targets)
    return out


def data_tensors(batches: dict) -> dict[str, torch.Tensor]:
    d = {}
    for (s, r), (args, targets) in sorted(batches.items()):
        for name, t in args.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ExportError(f"data argument name `{name}` is not an identifier")
            d[f"{name}.{s}.{r}"] = t.contiguous()
        if targets is not None:
            d[f"targets.{s}.{r}"] = targets.contiguous()
    return d


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (0 when both are all zero)."""
    a, b = a.double(), b.double()
    denom = b.abs().max().item()
    diff = (a - b).abs().max().item() if a.numel() else 0.0
    return diff / denom if denom > 0 else diff


def summarize_grad_errors(grad_err: dict[str, float], grad_abs: dict[str, float]) -> dict[str, Any]:
    """Per-tensor errors and their max, leaving out gradients that are zero in exact arithmetic
    (a conv bias before BatchNorm, an attention key bias): there both sides are float noise and
    the relative error says nothing. Those are listed in `near_zero_grads`."""
    floor = NEAR_ZERO * max(grad_abs.values(), default=0.0)
    near_zero = sorted(n for n, a in grad_abs.items() if a <= floor)
    return {
        "grad_max_rel_err": max((e for n, e in grad_err.items() if n not in near_zero), default=0.0),
        "grad_rel_err": grad_err,
        "grad_max_abs": grad_abs,
        "near_zero_grads": near_zero,
        "near_zero_floor": floor,
    }


def computation_args(forward_text: str) -> list[str]:
    m = re.search(r"^def computation\(([^)]*)\):", forward_text, re.M)
    if not m:
        raise ExportError("forward trace has no `def computation(...)` line")
    return [a.strip() for a in m.group(1).split(",") if a.strip()]


def prologue_state_names(prologue_text: str) -> dict[str, str]:
    """Prologue variable -> FQN for every `module.get_parameter/get_buffer('fqn')` line, and for
    every tensor attribute of a sub-module it reads (`x: "cpu f32[32, 4]" = m1.embed_positions`
    after `m1: "Any" = module.get_submodule('h.0.attn')`: `h.0.attn.embed_positions`)."""
    pat = re.compile(r"^\s*(\w+)(?::\s*\"[^\"]*\")?\s*=\s*\w+\.get_(?:parameter|buffer)\('([^']+)'\)", re.M)
    names = {m.group(1): m.group(2) for m in pat.finditer(prologue_text)}
    return {**names, **prologue_attribute_names(prologue_text)}


def prologue_attribute_names(prologue_text: str) -> dict[str, str]:
    """Prologue variable -> FQN of the tensor attributes of sub-modules it reads (neither
    parameters nor buffers: GPT-J's `embed_positions`), as `ir/src/prologue.rs` reads them."""
    subs = dict(re.findall(r"^\s*(\w+): \"[^\"]*\" = module\.get_submodule\('([^']*)'\)", prologue_text, re.M))
    out = {}
    for name, ty, mod, attr in re.findall(r"^\s*(\w+): \"([^\"]*)\" = (\w+)\.(\w+)\s*$", prologue_text, re.M):
        if mod in subs and "[" in ty:
            out[name] = f"{subs[mod]}.{attr}" if subs[mod] else attr
    return out


def add_attribute_tensors(state: dict, model: nn.Module, prologue_text: str) -> None:
    """Saves the tensor attributes the prologue reads under their FQNs, beside the state."""
    for fqn in prologue_attribute_names(prologue_text).values():
        if fqn in state:
            continue
        path, _, attr = fqn.rpartition(".")
        t = getattr(model.get_submodule(path), attr)
        if not isinstance(t, torch.Tensor):
            raise ExportError(f"the prologue reads `{fqn}` as a tensor, but it is a {type(t).__name__}")
        state[fqn] = t.detach().clone().contiguous()


def check_signature(forward_text: str, prologue_text: str, data_names: list[str], state: dict) -> None:
    """Every forward argument is a data argument of the batch or a parameter/buffer of the prologue."""
    args = computation_args(forward_text)
    from_state = prologue_state_names(prologue_text)
    missing = [n for n in data_names if n not in args]
    if missing:
        raise ExportError(f"data arguments {missing} are not arguments of the forward trace {args}")
    unknown = [a for a in args if a not in data_names and a not in from_state]
    if unknown:
        raise ExportError(f"forward arguments {unknown} are neither data nor a get_parameter/get_buffer of the prologue")
    not_saved = sorted({fqn for fqn in from_state.values() if fqn not in state})
    if not_saved:
        raise ExportError(f"prologue takes {not_saved}, which the model does not have")


_SOURCE_COMMENT = re.compile(r"^(\s*# )(\S+?)(:\d+: )", re.M)


def portable_source_paths(trace_text: str) -> str:
    """Cut the absolute paths of source-location comments (`  # /x/site-packages/torch/...:134: `)
    to `site-packages/...` (or the path below this package's repository), as in the shared
    exports, so the corpus does not depend on where Python lives. Nothing else changes."""
    here = str(Path(__file__).resolve().parents[3]) + "/"

    def cut(m: re.Match) -> str:
        path = m.group(2)
        i = path.rfind("site-packages/")
        if i >= 0:
            path = path[i:]
        elif path.startswith(here):
            path = path[len(here) :]
        return m.group(1) + path + m.group(3)

    return _SOURCE_COMMENT.sub(cut, trace_text)


def header(trace_text: str) -> tuple[str, float | None]:
    first = trace_text.splitlines()[0] if trace_text else ""
    m = re.match(r"# Constructed by (.*?)(?: \(took (\d+) milliseconds\))?$", first)
    if not m:
        return first, None
    return m.group(1), (float(m.group(2)) if m.group(2) else None)


def provenance(traces: list) -> list[list]:
    """[transform, milliseconds] for each trace Thunder kept, in order."""
    out = []
    for t in traces:
        name, ms = header(str(t))
        out.append([name, ms])
    return out


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=1))


def versions() -> dict[str, str]:
    import thunder

    return {"thunder": thunder.__version__, "torch": torch.__version__.split("+")[0]}


# ---- runs ------------------------------------------------------------------------------------


def build(model_factory: Callable[[], nn.Module], seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = model_factory()
    model.train()
    return model


def eager_step(model: nn.Module, args, targets, loss: str, output: int, seed: int):
    """One eager forward/backward. Returns (loss, grads by first FQN of each parameter)."""
    torch.manual_seed(seed)
    out = pick_output(model(*args.values()), output)
    value = compute_loss(loss, out, targets)
    value.backward()
    grads = OrderedDict(
        (n, p.grad.detach().clone().contiguous()) for n, p in model.named_parameters() if p.grad is not None
    )
    return float(value.detach()), grads


def thunder_step(jm, args, targets, loss: str, output: int, seed: int) -> dict[str, Any]:
    """One forward/backward through a jitted module; times the first call and backward."""
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    out = pick_output(jm(*args.values()), output)
    t1 = time.perf_counter()
    value = compute_loss(loss, out, targets)
    value.backward()
    t2 = time.perf_counter()
    return {"loss": float(value.detach()), "first_forward_s": t1 - t0, "first_backward_s": t2 - t1}


def module_grads(jm, names: list[str]) -> "OrderedDict[str, torch.Tensor]":
    grads = OrderedDict()
    for n in names:
        g = jm.get_parameter(n).grad
        if g is not None:
            grads[n] = g.detach().clone().contiguous()
    return grads


def traces_of(jm) -> dict[str, Any]:
    import thunder

    fw = thunder.last_traces(jm)
    bw = thunder.last_backward_traces(jm)
    pro = thunder.last_prologue_traces(jm)
    if not fw or not bw or not pro:
        raise ExportError("Thunder kept no forward, backward or prologue trace (was the backward run?)")
    return {
        "forward": str(fw[-1]),
        "backward": str(bw[-1]),
        "prologue": str(pro[-1]),
        "provenance": {"forward": provenance(fw), "backward": provenance(bw), "prologue": provenance(pro)},
    }


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_DDP_TIMERS: dict[str, list[float]] | None = None


def instrument_ddp_transforms() -> dict[str, list[float]]:
    """Wrap Thunder's DDP trace transforms with timers (once per process) and zero them; returns
    {name: [seconds, calls]}, which the wrappers update in place: the `ddp pass` on the forward
    (DDPTransform.transform_traces_pre_prologue), gradient all-reduce bucketing
    (apply_bucketing_to_grad_allreduce, run in transform_for_execution on every trace) and
    `maybe_sort_waits`. The all-reduces themselves are inserted by the grad transform (the
    backward of `synchronize`), which cannot be timed apart from the rest of it."""
    global _DDP_TIMERS
    if _DDP_TIMERS is not None:
        for v in _DDP_TIMERS.values():
            v[0], v[1] = 0.0, 0
        return _DDP_TIMERS

    import thunder.distributed.transforms.ddp as ddp_mod
    import thunder.distributed.utils as dist_utils
    from thunder.distributed.transforms.ddp_v2 import DDPTransform

    acc: dict[str, list[float]] = {}

    def timed(name, fn):
        acc[name] = [0.0, 0]

        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                acc[name][0] += time.perf_counter() - t0
                acc[name][1] += 1

        return wrapper

    DDPTransform.transform_traces_pre_prologue = timed("ddp_pass", DDPTransform.transform_traces_pre_prologue)
    ddp_mod.apply_bucketing_to_grad_allreduce = timed(
        "bucketing_all_reduce", ddp_mod.apply_bucketing_to_grad_allreduce
    )
    dist_utils.maybe_sort_waits = timed("sort_waits", dist_utils.maybe_sort_waits)
    _DDP_TIMERS = acc
    return acc


def _best(runs: list[dict]) -> dict:
    """The run with the smallest total (the least disturbed by other load), plus every total."""
    best = min(runs, key=lambda r: r["total_s"])
    return {**best, "repeats": len(runs), "all_total_s": [r["total_s"] for r in runs]}


def _ddp_worker(rank, world, port, model_factory, batches, loss, output, seed, result_dir, repeats=1):
    import torch.distributed as tdist

    import thunder
    import thunder.distributed

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    tdist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        args, targets = batches[(0, rank)]
        # Warm up (imports, Thunder's caches of op tables), untimed; then, `repeats` times, time
        # plain jit and DDP of fresh instances (Thunder caches per jitted module, so each compiles).
        thunder_step(thunder.jit(build(model_factory, seed)), args, targets, loss, output, seed)
        plain_runs, ddp_runs, first = [], [], None
        for _ in range(max(1, repeats)):
            t0 = time.perf_counter()
            plain = thunder.jit(build(model_factory, seed))
            t1 = time.perf_counter()
            plain_run = thunder_step(plain, args, targets, loss, output, seed)
            pt = {"jit_s": t1 - t0, **{k: v for k, v in plain_run.items() if k != "loss"}}
            pt["total_s"] = sum(pt.values())
            pt["trace_transforms_ms"] = traces_of(plain)["provenance"]
            plain_runs.append(pt)

            model = build(model_factory, seed)
            names = [n for n, _ in model.named_parameters()]
            transforms = instrument_ddp_transforms()
            t0 = time.perf_counter()
            jm = thunder.jit(model)
            t1 = time.perf_counter()
            dm = thunder.distributed.ddp(jm)
            t2 = time.perf_counter()
            run = thunder_step(dm, args, targets, loss, output, seed)
            dt = {"jit_s": t1 - t0, "ddp_wrap_s": t2 - t1, **{k: v for k, v in run.items() if k != "loss"}}
            dt["total_s"] = sum(dt.values())
            dt["ddp_trace_transforms"] = {k: {"s": v[0], "calls": int(v[1])} for k, v in transforms.items()}
            dt["ddp_trace_transforms_total_s"] = sum(v[0] for v in transforms.values())
            ddp_runs.append(dt)
            if first is None:
                first = (dm, names, run["loss"])
        if rank == 0:
            dm, names, first_loss = first
            torch.save(
                {
                    "traces": traces_of(dm),
                    "loss": first_loss,
                    "grads": module_grads(dm, names),
                    "timing": _best(ddp_runs),
                    "plain_timing": _best(plain_runs),
                },
                os.path.join(result_dir, "rank0.pt"),
            )
        tdist.barrier()
    finally:
        tdist.destroy_process_group()


def run_ddp(model_factory, batches, loss, output, seed, world, repeats=1) -> dict[str, Any]:
    import torch.multiprocessing as mp

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            _ddp_worker,
            args=(world, free_port(), model_factory, batches, loss, output, seed, tmp, repeats),
            nprocs=world,
            join=True,
            start_method="spawn",
        )
        path = os.path.join(tmp, "rank0.pt")
        if not os.path.exists(path):
            raise ExportError("DDP rank 0 wrote no result")
        return torch.load(path, weights_only=False)


def run_plain(model_factory, args, targets, loss, output, seed) -> dict[str, Any]:
    import thunder

    # Warm-up run on another instance so the timing below is of this model's compile alone.
    thunder_step(thunder.jit(build(model_factory, seed)), args, targets, loss, output, seed)
    model = build(model_factory, seed)
    names = [n for n, _ in model.named_parameters()]
    t0 = time.perf_counter()
    jm = thunder.jit(model)
    t1 = time.perf_counter()
    run = thunder_step(jm, args, targets, loss, output, seed)
    timing = {"jit_s": t1 - t0, **{k: v for k, v in run.items() if k != "loss"}}
    return {"traces": traces_of(jm), "loss": run["loss"], "grads": module_grads(jm, names), "timing": timing}


# ---- the export ------------------------------------------------------------------------------


def export(
    model_factory: Callable[[], nn.Module],
    batch: Callable[[torch.Generator], tuple[dict, torch.Tensor]],
    loss: str,
    out_dir: str | os.PathLike,
    *,
    name: str,
    output: int = 0,
    ddp: int | None = None,
    steps: int = 4,
    ranks: int | None = None,
    seed: int = 0,
    data_seed: int = 1234,
    deterministic: bool = True,
    timing_repeats: int = 1,
) -> dict[str, Any]:
    """Trace `model_factory()` with Thunder and write the export directory `out_dir`.

    `batch(generator)` returns (ordered dict of the forward's data arguments, targets); it is called
    `steps` x `ranks` times (ranks defaults to 4 for a plain export, `ddp` for a DDP one). The model
    is called as `model(*args.values())`; its output (`out[output]` for a tuple) goes to `loss`.
    With `ddp=N`, `model_factory` and `batch` must be picklable (module-level functions), and
    `timing_repeats` > 1 compiles plain and DDP that many times, keeping the fastest of each.
    Returns a summary (losses, errors, timings).
    """
    from safetensors.torch import save_file

    if loss not in LOSSES:
        raise ExportError(f"unknown loss `{loss}`; valid: {', '.join(LOSSES)}")
    if ddp is not None and ddp < 1:
        raise ExportError(f"--ddp needs at least 1 rank, got {ddp}")
    if steps < 1:
        raise ExportError(f"steps must be at least 1, got {steps}")
    ranks = ranks if ranks is not None else (ddp if ddp else 4)
    if ddp and ranks < ddp:
        raise ExportError(f"a DDP export on {ddp} ranks needs at least {ddp} ranks of data, got {ranks}")
    out_dir = Path(out_dir)

    batches = make_batches(batch, steps, ranks, data_seed)
    args0, targets0 = batches[(0, 0)]
    if loss in ("cross_entropy", "mse") and targets0 is None:
        raise ExportError(f"loss `{loss}` needs targets")

    model = build(model_factory, seed)
    state = snapshot_state(model)
    tied = tied_groups(model)
    eager_loss, eager_grads = eager_step(model, args0, targets0, loss, output, seed)

    if ddp:
        res = run_ddp(model_factory, batches, loss, output, seed, ddp, timing_repeats)
        # Thunder's DDP pre-averages: rank 0's gradients are the mean of every rank's.
        per_rank = [eager_grads] + [
            eager_step(build(model_factory, seed), *batches[(0, r)], loss, output, seed)[1] for r in range(1, ddp)
        ]
        expected = OrderedDict((n, sum(g[n] for g in per_rank) / ddp) for n in eager_grads)
    else:
        res = run_plain(model_factory, args0, targets0, loss, output, seed)
        expected = eager_grads
    tr = res["traces"]
    add_attribute_tensors(state, model, tr["prologue"])
    check_signature(tr["forward"], tr["prologue"], list(args0.keys()), state)

    if set(res["grads"]) != set(expected):
        raise ExportError(
            f"Thunder and eager disagree on which parameters get gradients: "
            f"{sorted(set(res['grads']) ^ set(expected))}"
        )
    grad_err = {n: rel_err(res["grads"][n], expected[n]) for n in expected}
    grad_abs = {n: float(g.abs().max()) if g.numel() else 0.0 for n, g in expected.items()}
    grad_summary = summarize_grad_errors(grad_err, grad_abs)

    if out_dir.exists():
        shutil.rmtree(out_dir)
    (out_dir / "reference").mkdir(parents=True)
    for kind in ("forward", "backward", "prologue"):
        (out_dir / f"{kind}.trace").write_text(portable_source_paths(tr[kind]))
    save_file(dict(state), str(out_dir / "params.safetensors"))
    save_file(data_tensors(batches), str(out_dir / "data.safetensors"))
    v = versions()
    meta = {
        "format": FORMAT,
        "model": name,
        "loss": loss,
        "output": output,
        "targets": "targets",
        "tied": tied,
        "world_size": ddp if ddp else None,
        "thunder": v["thunder"],
        "torch": v["torch"],
    }
    write_json(out_dir / "export.json", meta)
    write_json(
        out_dir / "reference" / "loss.json",
        {
            "losses": [eager_loss],
            "ranks": 1,
            "deterministic": deterministic,
            "note": f"step 0, rank 0 batch, eager PyTorch {v['torch']}",
        },
    )
    save_file(dict(eager_grads), str(out_dir / "reference" / "grads.safetensors"))
    check = {
        "thunder_loss": res["loss"],
        "eager_loss": eager_loss,
        "grads_against": "eager, mean over ranks' step-0 batches" if ddp else "eager, rank 0 step 0",
        **grad_summary,
        "deterministic": deterministic,
    }
    write_json(out_dir / "reference" / "thunder_check.json", check)
    timing = {"world_size": ddp, "note": "seconds on rank 0, after an untimed warm-up jit of another instance"}
    if ddp:
        timing["thunder"] = {k: v for k, v in res["timing"].items() if not k.startswith("ddp_trace")}
        timing["plain_thunder"] = res["plain_timing"]
        # What DDP adds over plain jit: the wrap plus the extra compile time of the first step.
        timing["ddp_overhead_s"] = res["timing"]["total_s"] - res["plain_timing"]["total_s"]
        timing["ddp_trace_transforms"] = res["timing"]["ddp_trace_transforms"]
        timing["ddp_trace_transforms_total_s"] = res["timing"]["ddp_trace_transforms_total_s"]
    else:
        timing["thunder"] = res["timing"]
        timing["thunder"]["total_s"] = sum(res["timing"].values())
    timing["trace_transforms_ms"] = tr["provenance"]
    write_json(out_dir / "reference" / "thunder_timing.json", timing)
    return {
        "name": name,
        "out_dir": str(out_dir),
        "eager_loss": eager_loss,
        "thunder_loss": res["loss"],
        "grad_max_rel_err": check["grad_max_rel_err"],
        "timing": timing,
        "tied": tied,
    }
