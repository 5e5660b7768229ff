"""Thunder's DDP, planned by tracepass.

Two ways in, as with Thunder's own DDP::

    model = tracepass.thunder.ddp(thunder.jit(model))            # like thunder.distributed.ddp
    model = thunder.jit(model, transforms=[tracepass.thunder.DDP(broadcast_from=0)])

When Thunder has made the backward it is about to run (its post-optimization trace: executor
symbols and fusion regions as Thunder chose them), the transform hands its printed form to
tracepass's planner (`tracepass._native.plan_ddp`, the `ddp` pass's own gradient selection and
bucketing). The plan says which returned gradients to synchronize (a tie once, frozen
parameters never), how to bucket them in the order the backward completes them and after which
statement each bucket's all-reduce goes. This module only maps the plan onto Thunder's bound
symbols: each bucket is packed, divided by the world size (one op per bucket, before the
reduction) and all-reduced (``torch.distributed``, asynchronously: gloo on CPU, NCCL on GPU)
right after its last gradient is computed, and each wait and unpack goes just before the
return. Anything
the planner cannot read (an op it does not know, a Thunder whose traces it cannot map) is a
:class:`ThunderDDPError` when Thunder compiles the model (its first call), never a step with
unsynchronized gradients. ``DDP(fallback_to_thunder=True)`` opts into unplanned, unbucketed
all-reduces after the backward (Thunder's ``bucket_size_in_mb=0`` DDP) instead of that error.

``no_sync(model)`` (or ``model.no_sync()``) accumulates gradients without communication and,
on exit, all-reduces what was accumulated, as Thunder does.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as tdist

from . import _native
from .errors import PlanError, ThunderDDPError

__all__ = ["DDP", "DDPPlugin", "ThunderDDPError", "ddp", "no_sync", "plan_of", "CollectiveLog"]


# ---- the collectives, as one Thunder executor -------------------------------------------------


@dataclass
class _Layout:
    """What a bucket's collectives need at run time (Thunder passes only the plan's key)."""

    group: Any
    world_size: int
    offsets: list[int]
    numels: list[int]
    shapes: list[tuple[int, ...]]


_LAYOUTS: dict[tuple[int, int], _Layout] = {}
_PLAN_KEYS = itertools.count()
_LAYOUT_LOCK = threading.Lock()


class _Pending:
    """An all-reduce in flight: its work handle and the flat buffer it reduces in place."""

    __slots__ = ("work", "buffer")

    def __init__(self, work, buffer):
        self.work = work
        self.buffer = buffer


def _tie_add_impl(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


def _bucket_start_impl(grads: list[torch.Tensor], plan_key: int, bucket: int) -> _Pending:
    layout = _LAYOUTS[(plan_key, bucket)]
    # the pre-division by the world size, once per bucket: one op on the packed buffer instead
    # of one per gradient (elementwise, so each value is divided exactly as on its own)
    if len(grads) == 1:
        buffer = torch.div(grads[0].reshape(-1), layout.world_size)
    else:
        buffer = torch.cat([g.reshape(-1) for g in grads])
        buffer.div_(layout.world_size)
    # looked up at call time, so instrumentation (tests, profilers) sees each call
    work = tdist.all_reduce(buffer, op=tdist.ReduceOp.SUM, group=layout.group, async_op=True)
    return _Pending(work, buffer)


def _bucket_finish_impl(pending: _Pending, plan_key: int, bucket: int) -> tuple[torch.Tensor, ...]:
    layout = _LAYOUTS[(plan_key, bucket)]
    pending.work.wait()
    buf = pending.buffer
    return tuple(buf[o : o + n].view(s) for o, n, s in zip(layout.offsets, layout.numels, layout.shapes))


_OPS: dict[str, Any] = {}


def _ops() -> dict[str, Any]:
    """Registers the executor once: tie sum, bucket start (pack, pre-divide by the world size,
    async all-reduce) and bucket finish (wait + unpack)."""
    if _OPS:
        return _OPS
    from thunder.core.proxies import TensorProxy
    from thunder.extend import OperatorExecutor, register_executor

    ex = OperatorExecutor("tracepass_ddp", version="0.1")
    register_executor(ex)

    def tie_add_meta(a, b):
        return TensorProxy(like=a)

    def start_meta(grads, plan_key, bucket):
        layout = _LAYOUTS[(plan_key, bucket)]
        return TensorProxy(like=grads[0], shape=(sum(layout.numels),))

    def finish_meta(pending, plan_key, bucket):
        layout = _LAYOUTS[(plan_key, bucket)]
        return tuple(TensorProxy(like=pending, shape=tuple(s)) for s in layout.shapes)

    _OPS["tie_add"] = ex.register_operator("tracepass_tie_add", meta=tie_add_meta, fn=_tie_add_impl)
    _OPS["start"] = ex.register_operator("tracepass_bucket_start", meta=start_meta, fn=_bucket_start_impl)
    _OPS["finish"] = ex.register_operator("tracepass_bucket_finish", meta=finish_meta, fn=_bucket_finish_impl)
    return _OPS


# ---- the transform ------------------------------------------------------------------------------


def _default_group():
    if not tdist.is_available() or not tdist.is_initialized():
        raise ThunderDDPError(
            "torch.distributed is not initialized: call torch.distributed.init_process_group first "
            "(torchrun sets the environment it reads)",
            "options",
        )
    return tdist.distributed_c10d._get_default_group()


def _line_of(trace, name: str | None) -> tuple[str, int | None]:
    """The printed statement of `trace` that defines `name`, with its line number (for a
    message), and that line number."""
    if name is None:
        return "", None
    for i, line in enumerate(str(trace).splitlines(), 1):
        s = line.strip()
        lhs = s.split(" = ", 1)[0] if " = " in s and not s.startswith("#") else ""
        if name in [t.strip() for t in lhs.replace("(", "").replace(")", "").split(",")]:
            return f" (line {i}: `{s.split('  #')[0]}`)", i
    return "", None


class DDP:
    """Placeholder replaced below by the Transform subclass once Thunder is importable."""


def _make_transform_class():
    from thunder.core.transform_common import Transform

    class DDP(Transform):
        """tracepass's DDP as a Thunder transform: ``thunder.jit(model, transforms=[DDP()])``.

        Args:
            bucket_size_in_mb: bucket cap in MiB (``<= 0``: one all-reduce per gradient).
            broadcast_from: rank (of ``process_group``) whose parameters and buffers every rank
                takes at setup; ``None`` skips it.
            process_group: the group gradients are averaged over (default: the default group).
            fallback_to_thunder: where tracepass cannot plan the backward, all-reduce each
                parameter gradient after the backward, unbucketed, as Thunder's DDP with
                ``bucket_size_in_mb=0`` would, instead of raising :class:`ThunderDDPError` (a
                warning says so).
        """

        def __init__(
            self,
            bucket_size_in_mb: float = 25.0,
            broadcast_from: int | None = None,
            process_group=None,
            *,
            fallback_to_thunder: bool = False,
        ):
            self.bucket_size_in_mb = float(bucket_size_in_mb)
            self.broadcast_from = broadcast_from
            self.process_group = process_group
            self.fallback_to_thunder = fallback_to_thunder
            self.plans: list[dict] = []
            self._arg_fqns: list[str | None] | None = None
            self._model = None
            self._group = None

        def __repr__(self) -> str:
            return (
                f"tracepass.thunder.DDP(bucket_size_in_mb={self.bucket_size_in_mb}, "
                f"broadcast_from={self.broadcast_from})"
            )

        # -- setup: once, on the ThunderModule --------------------------------------------------

        def transform_module(self, model) -> None:
            from thunder import compile_data as get_compile_data

            group = self.process_group if self.process_group is not None else _default_group()
            world = tdist.get_world_size(group)
            if world < 2:
                raise ThunderDDPError(
                    f"world size {world}: tracepass.thunder.DDP needs at least 2 ranks to average "
                    "gradients over (run under torchrun --nproc-per-node N, N >= 2)",
                    "options",
                )
            self._group = group
            self._model = model
            cd = get_compile_data(model)
            # Thunder keys its cache on `no_sync` only for modules marked as data parallel, and
            # `ThunderModule.no_sync` all-reduces the accumulated gradients on exit with this group.
            cd.use_ddp = True
            cd.process_group_for_ddp = group
            orig = cd.fn
            orig.use_ddp = True
            orig.process_group_for_ddp = group
            orig.bucket_size_in_mb = self.bucket_size_in_mb
            if self.broadcast_from is not None:
                with torch.no_grad():
                    for _, p in model.named_parameters():
                        tdist.broadcast(p.data, group_src=self.broadcast_from, group=group)
                    for _, b in model.named_buffers():
                        tdist.broadcast(b, group_src=self.broadcast_from, group=group)
            _install_no_sync(model)

        # -- which computation argument is which parameter --------------------------------------

        def transform_traces_pre_prologue(self, prologue_trace, computation_trace, epilogue_trace, **kwargs):
            from thunder.core import prims, utils

            producers = utils.producers(prologue_trace)
            fqns: list[str | None] = []
            for out, _arg in zip(prologue_trace.output[0], computation_trace.args):
                bsym = producers[out]
                fqns.append(bsym.args[1] if bsym.sym is prims.unpack_parameter else None)
            self._arg_fqns = fqns
            return prologue_trace, computation_trace, epilogue_trace

        # -- the backward Thunder is about to run -------------------------------------------------

        def transform_trace_post_optimization(self, trace, **kwargs):
            from thunder.core.trace import TraceTag
            from thunder.distributed import get_skip_data_parallel_grad_sync

            if TraceTag.BACKWARD not in trace.tags:
                return trace
            if get_skip_data_parallel_grad_sync():
                # no_sync: Thunder compiles this backward apart, and it stays local
                return trace
            try:
                plan = self._plan(trace)
                new = _apply_plan(trace, plan, self._group)
            except ThunderDDPError as e:
                if not self.fallback_to_thunder:
                    raise
                if self._arg_fqns is None or self._model is None:
                    raise
                warnings.warn(f"tracepass.thunder.DDP falls back to unplanned all-reduces: {e}")
                returned = trace.bound_symbols[-1].args[0]
                positions = [
                    pos
                    for fqn, pos, requires_grad, _tied in _plan_params(self._model, self._arg_fqns, returned)
                    if pos is not None and requires_grad
                ]
                return _fallback(trace, self._group, positions)
            self.plans.append(plan)
            return new

        def _plan(self, trace) -> dict:
            if self._arg_fqns is None or self._model is None:
                raise ThunderDDPError(
                    "this Thunder did not call the transform's setup (transform_module and "
                    "transform_traces_pre_prologue) before the backward: its traces cannot be mapped",
                    "mapping",
                )
            from thunder.core.prims import PrimIDs

            ret = trace.bound_symbols[-1]
            if ret.sym.id != PrimIDs.RETURN:
                raise ThunderDDPError(
                    f"the backward's last statement is `{ret.sym.name}`, not its return: this "
                    "Thunder's traces cannot be mapped",
                    "mapping",
                )
            returned = ret.args[0] if ret.args else None
            if not isinstance(returned, (tuple, list)) or len(returned) != len(self._arg_fqns):
                raise ThunderDDPError(
                    f"the backward returns {type(returned).__name__} of "
                    f"{len(returned) if isinstance(returned, (tuple, list)) else '?'} values for "
                    f"{len(self._arg_fqns)} inputs of the forward: this Thunder's traces cannot be mapped",
                    "mapping",
                )
            params = _plan_params(self._model, self._arg_fqns, returned)
            text = str(trace)
            world = tdist.get_world_size(self._group)
            try:
                plan = _native.plan_ddp(text, params, world, self.bucket_size_in_mb)
            except PlanError as e:
                raise ThunderDDPError(
                    f"tracepass cannot plan DDP for this backward: {e.message}", e.kind, line=e.line
                ) from None
            _check_coverage(plan, params, returned, trace)
            plan["world_size"] = world
            plan["bucket_size_in_mb"] = self.bucket_size_in_mb
            return plan

    DDP.__qualname__ = "DDP"
    return DDP


def _make_plugin_class():
    from thunder import Plugin

    class DDPPlugin(Plugin):
        """tracepass's DDP as a Thunder plugin: ``thunder.compile(model, plugins=[DDPPlugin()])``
        (same arguments as :class:`DDP`)."""

        def __init__(self, bucket_size_in_mb: float = 25.0, broadcast_from: int | None = None, process_group=None):
            self.transform = DDP(
                bucket_size_in_mb=bucket_size_in_mb, broadcast_from=broadcast_from, process_group=process_group
            )

        def setup_transforms(self):
            return [self.transform]

    DDPPlugin.__qualname__ = "DDPPlugin"
    return DDPPlugin


def _plan_params(model, arg_fqns, returned) -> list[tuple[str, int | None, bool, str | None]]:
    """(fqn, return position, requires_grad, tied_to) for every parameter the forward takes;
    a parameter under two names (a tie) names its first, in the module's order."""
    first_name: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        first_name.setdefault(id(p), name)
    out = []
    for pos, fqn in enumerate(arg_fqns):
        if fqn is None:
            continue
        p = model.get_parameter(fqn)
        primary = first_name.get(id(p), fqn)
        tied_to = primary if primary != fqn and primary in arg_fqns else None
        has_grad = returned[pos] is not None
        out.append((fqn, pos if has_grad else None, bool(p.requires_grad), tied_to))
    return out


def _check_coverage(plan: dict, params, returned, trace) -> None:
    """Every gradient the backward returns for a parameter is in the plan (never one left
    unsynchronized): a gradient of a parameter the plan does not cover is an error naming both."""
    covered = {pos for g in plan["gradients"] for pos in g["positions"]}
    for fqn, pos, _requires_grad, _tied in params:
        if pos is not None and pos not in covered:
            name = getattr(returned[pos], "name", str(returned[pos]))
            where, line = _line_of(trace, name)
            raise ThunderDDPError(
                f"the backward returns gradient `{name}` for parameter `{fqn}`, which the DDP plan "
                f"does not cover{where}",
                "gradients",
                line=line,
            )


def _apply_plan(trace, plan: dict, group):
    """The backward with the plan's collectives: after each gradient's producer its division
    (and a tie's sum first), after each bucket's last gradient its pack and all-reduce, and all
    waits and unpacks just before the return."""
    from thunder.core.proxies import Proxy
    from thunder.core.trace import from_trace, tracectx

    ops = _ops()
    bsyms = list(trace.bound_symbols)
    ret = bsyms[-1]
    returned = list(ret.args[0])
    by_name: dict[str, Proxy] = {}
    producer_index: dict[str, int] = {}
    for i, b in enumerate(bsyms):
        for o in b.flat_proxy_outs:
            by_name[o.name] = o
            producer_index.setdefault(o.name, i)
    first_compute = next(
        (i for i, b in enumerate(bsyms) if b.sym.name not in ("unpack_trivial", "unpack_sequence", "clear_mutable_collection", "python_del")),
        len(bsyms) - 1,
    )

    def proxy(name: str):
        p = by_name.get(name)
        if p is None:
            raise ThunderDDPError(
                f"the plan names `{name}`, which no statement of Thunder's backward defines: "
                "this Thunder's traces cannot be mapped",
                "mapping",
            )
        return p

    def slot(name: str | None) -> int:
        # the statement after which to insert; before the first compute statement for inputs
        if name is None:
            return first_compute - 1
        proxy(name)
        return producer_index[name]

    plan_key = next(_PLAN_KEYS)
    grads = plan["gradients"]
    last_of_bucket = {b["gradients"][-1]: bi for bi, b in enumerate(plan["buckets"])}
    new = from_trace(trace)
    inserts: dict[int, list] = {}
    summed: list[Any] = [None] * len(grads)
    pendings: list[Any] = [None] * len(plan["buckets"])
    with tracectx(new):
        for bi, b in enumerate(plan["buckets"]):
            shapes = [tuple(grads[k]["shape"]) for k in b["gradients"]]
            numels = [int(torch.Size(s).numel()) for s in shapes]
            offsets = list(itertools.accumulate([0] + numels[:-1]))
            with _LAYOUT_LOCK:
                _LAYOUTS[(plan_key, bi)] = _Layout(group, plan["world_size"], offsets, numels, shapes)
        for k, g in enumerate(grads):
            at = slot(g["ready_after"])
            new.push_scope([])
            values = [proxy(v) for v in g["values"]]
            acc = values[0]
            for v in values[1:]:
                acc = ops["tie_add"](acc, v)
            summed[k] = acc
            if k in last_of_bucket:
                bi = last_of_bucket[k]
                members = [summed[m] for m in plan["buckets"][bi]["gradients"]]
                pendings[bi] = ops["start"](members, plan_key, bi)
            inserts.setdefault(at, []).extend(new.pop_scope())
        new.push_scope([])
        reduced: dict[int, Any] = {}
        for bi, b in enumerate(plan["buckets"]):
            outs = ops["finish"](pendings[bi], plan_key, bi)
            for k, o in zip(b["gradients"], outs):
                reduced[k] = o
        tail = new.pop_scope()
    for k, g in enumerate(grads):
        for pos in g["positions"]:
            returned[pos] = None
        returned[g["return_position"]] = reduced[k]
    body = []
    for i, b in enumerate(bsyms[:-1]):
        if i == 0 and -1 in inserts:
            body.extend(inserts[-1])
        body.append(b)
        body.extend(inserts.get(i, ()))
    body.extend(tail)
    body.append(ret.from_bsym(args=(tuple(returned),)))
    new.bound_symbols = body
    new.set_provenance(_provenance(plan))
    return new


def _provenance(plan: dict):
    from thunder.core.trace import TraceProvenance

    return TraceProvenance(
        f"tracepass DDP (world_size={plan['world_size']}, bucket_size_in_mb={plan['bucket_size_in_mb']}, "
        f"{len(plan['buckets'])} buckets)"
    )


def _fallback(trace, group, positions: list[int]):
    """The opt-in fallback for a backward tracepass cannot plan: each parameter gradient at
    `positions` divided by the world size and all-reduced on its own after the backward, as
    Thunder's unbucketed DDP (`bucket_size_in_mb=0`) would, with no overlap."""
    from thunder.core.trace import from_trace, tracectx

    ops = _ops()
    bsyms = list(trace.bound_symbols)
    ret = bsyms[-1]
    returned = list(ret.args[0])
    world = tdist.get_world_size(group)
    plan_key = next(_PLAN_KEYS)
    new = from_trace(trace)
    with tracectx(new):
        new.push_scope([])
        for pos in positions:
            g = returned[pos]
            with _LAYOUT_LOCK:
                _LAYOUTS[(plan_key, pos)] = _Layout(
                    group, world, [0], [int(torch.Size(g.shape).numel())], [tuple(g.shape)]
                )
            returned[pos] = ops["finish"](ops["start"]([g], plan_key, pos), plan_key, pos)[0]
        tail = new.pop_scope()
    new.bound_symbols = bsyms[:-1] + tail + [ret.from_bsym(args=(tuple(returned),))]
    return new


# ---- no_sync --------------------------------------------------------------------------------


def _install_no_sync(model) -> None:
    """Replaces the ThunderModule's `no_sync` with one that refuses to nest (a nested exit would
    all-reduce the accumulated gradients twice)."""
    original = type(model).no_sync

    @contextlib.contextmanager
    def guarded():
        if getattr(model, "_tracepass_in_no_sync", False):
            raise ThunderDDPError(
                "no_sync() is already active on this model: nesting it would all-reduce the "
                "accumulated gradients twice on exit",
                "no_sync",
            )
        object.__setattr__(model, "_tracepass_in_no_sync", True)
        try:
            with original(model):
                yield
        finally:
            object.__setattr__(model, "_tracepass_in_no_sync", False)

    object.__setattr__(model, "no_sync", guarded)


def no_sync(model):
    """Context manager: backward passes inside accumulate gradients locally; on exit the
    accumulated gradients are averaged across ranks (as ``ThunderModule.no_sync``). Nesting it
    is an error."""
    if "no_sync" not in vars(model):
        raise ThunderDDPError(
            f"{type(model).__name__} is not a model made by tracepass.thunder.ddp or jitted with "
            "tracepass.thunder.DDP",
            "no_sync",
        )
    return model.no_sync()


# ---- entry points -------------------------------------------------------------------------------


def ddp(model, *, broadcast_from: int | None = 0, bucket_size_in_mb: float = 25.0, process_group=None):
    """``thunder.distributed.ddp``, done by tracepass: ``tracepass.thunder.ddp(thunder.jit(model))``.
    An ``nn.Module`` not yet jitted is jitted first."""
    import thunder
    from thunder.core.module import ThunderModule
    from thunder.core.transforms import add_transform

    if not isinstance(model, ThunderModule):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"tracepass.thunder.ddp takes an nn.Module or a ThunderModule, got {type(model).__name__}")
        model = thunder.jit(model)
    transform = DDP(bucket_size_in_mb=bucket_size_in_mb, broadcast_from=broadcast_from, process_group=process_group)
    return add_transform(model, transform=transform)


def plan_of(model) -> dict:
    """The latest plan tracepass made for ``model``'s backward (gradients, buckets), once
    Thunder compiled it (after the first forward)."""
    for t in getattr(model, "_lc_transforms", []):
        if isinstance(t, DDP) and t.plans:
            return t.plans[-1]
    raise ThunderDDPError("no tracepass DDP plan for this model yet (run a forward first)", "mapping")


class CollectiveLog:
    """Records, in order, each all-reduce issued through ``torch.distributed`` and (optionally)
    each aten op run, while active: ``with CollectiveLog(ops=True) as log: loss.backward()``.
    ``log.events`` holds ``("all_reduce", numel)`` and ``("op", name)`` tuples."""

    def __init__(self, ops: bool = False):
        self.events: list[tuple[str, Any]] = []
        self._ops = ops
        self._saved = None
        self._mode = None

    def __enter__(self):
        self._saved = tdist.all_reduce
        saved, events = self._saved, self.events

        def all_reduce(tensor, *args, **kwargs):
            events.append(("all_reduce", tensor.numel()))
            return saved(tensor, *args, **kwargs)

        tdist.all_reduce = all_reduce
        if self._ops:
            from torch.utils._python_dispatch import TorchDispatchMode

            class _Ops(TorchDispatchMode):
                def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                    events.append(("op", str(func.overloadpacket)))
                    return func(*args, **(kwargs or {}))

            self._mode = _Ops()
            self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        if self._mode is not None:
            self._mode.__exit__(*exc)
        tdist.all_reduce = self._saved
        return False

    @property
    def all_reduces(self) -> int:
        return sum(1 for e in self.events if e[0] == "all_reduce")


try:
    DDP = _make_transform_class()  # noqa: F811
except ImportError:  # Thunder absent: tracepass itself does not need it
    pass
try:
    DDPPlugin = _make_plugin_class()
except ImportError:  # a Thunder without plugins
    pass
