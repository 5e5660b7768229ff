"""tracepass.thunder refuses what it cannot synchronize, with a clear error when Thunder compiles
the model (its first call), never a step with unsynchronized gradients. In one process: a fake
process group (torch's `fake` backend, whose collectives do nothing) stands in for the ranks."""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")
thunder = pytest.importorskip("thunder")

import torch.distributed as tdist  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

import tracepass  # noqa: E402
import tracepass.thunder as tt  # noqa: E402


@pytest.fixture
def world():
    """A fake process group of `size` ranks (this process is rank 0)."""

    def init(size: int):
        tdist.init_process_group("fake", rank=0, world_size=size, store=FakeStore())

    yield init
    if tdist.is_initialized():
        tdist.destroy_process_group()


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def step(model) -> torch.Tensor:
    x = torch.randn(3, 8)
    loss = model(x).square().mean()
    loss.backward()
    return loss


def test_world_size_one_is_refused(world):
    world(1)
    with pytest.raises(tt.ThunderDDPError, match=r"world size 1") as e:
        tt.ddp(thunder.jit(mlp()))
    assert e.value.kind == "options"
    assert isinstance(e.value, tracepass.TracepassError)


def test_without_a_process_group_is_refused():
    assert not tdist.is_initialized()
    with pytest.raises(tt.ThunderDDPError, match="init_process_group"):
        tt.ddp(mlp())


def _custom_op_transform():
    """A transform (before tracepass's) that puts a user's executor op into the backward, as a
    custom executor would: tracepass does not know it."""
    from thunder.core.proxies import TensorProxy
    from thunder.core.trace import TraceTag, from_trace, tracectx
    from thunder.core.transform_common import Transform
    from thunder.extend import OperatorExecutor, register_executor

    ex = OperatorExecutor("user_frobnicate_ex")
    register_executor(ex)
    frob = ex.register_operator(
        "frobnicate", meta=lambda a: TensorProxy(like=a), fn=lambda a: a.clone()
    )

    class Inject(Transform):
        def transform_trace_post_optimization(self, trace, **kwargs):
            if TraceTag.BACKWARD not in trace.tags:
                return trace
            new = from_trace(trace)
            bsyms = list(trace.bound_symbols)
            ret = bsyms[-1]
            returned = list(ret.args[0])
            k = next(i for i, g in enumerate(returned) if g is not None and i > 0)
            with tracectx(new):
                new.push_scope([])
                returned[k] = frob(returned[k])
                extra = new.pop_scope()
            new.bound_symbols = bsyms[:-1] + extra + [ret.from_bsym(args=(tuple(returned),))]
            return new

    return Inject()


def test_unknown_op_in_the_backward_names_the_op_and_line(world):
    world(2)
    model = thunder.jit(mlp(), transforms=[_custom_op_transform(), tt.DDP()])
    with pytest.raises(tt.ThunderDDPError) as e:
        model(torch.randn(3, 8))  # Thunder compiles here: before any backward runs
    msg = str(e.value)
    assert e.value.kind == "parse", msg
    assert "frobnicate" in msg, msg
    assert re.search(r"line \d+", msg), msg
    # the line is an attribute too, as on every tracepass error, and it is the op's
    assert isinstance(e.value, tracepass.TracepassError)
    assert f"line {e.value.line}" in msg, (e.value.line, msg)


def test_unknown_op_with_the_fallback_still_synchronizes(world):
    world(2)
    model = thunder.jit(mlp(), transforms=[_custom_op_transform(), tt.DDP(fallback_to_thunder=True)])
    with pytest.warns(UserWarning, match="falls back"):
        out = model(torch.randn(3, 8))
    with tt.CollectiveLog() as log:
        out.square().mean().backward()
    # every parameter gradient, none of the input's: 4 all-reduces
    assert log.all_reduces == 4


def test_a_parameter_missing_from_the_plan_is_named(world, monkeypatch):
    world(2)
    real = tt._native.plan_ddp

    def drops_first_gradient(*args):
        plan = real(*args)
        dropped = plan["gradients"].pop(0)
        for b in plan["buckets"]:
            b["gradients"] = [k - 1 for k in b["gradients"] if k != 0]
        plan["dropped"] = dropped
        return plan

    monkeypatch.setattr(tt._native, "plan_ddp", drops_first_gradient)
    model = tt.ddp(thunder.jit(mlp()))
    with pytest.raises(tt.ThunderDDPError) as e:
        model(torch.randn(3, 8))
    msg = str(e.value)
    assert e.value.kind == "gradients", msg
    assert re.search(r"parameter `\d\.(weight|bias)`", msg), msg
    assert "does not cover" in msg and re.search(r"line \d+", msg), msg
    assert f"line {e.value.line}:" in msg, (e.value.line, msg)


def test_thunders_own_ddp_underneath_is_refused(world):
    world(2)
    import thunder.distributed

    model = tt.ddp(thunder.distributed.ddp(thunder.jit(mlp())))
    with pytest.raises(tt.ThunderDDPError, match="already all-reduces"):
        model(torch.randn(3, 8))


def test_no_sync_nested_twice_is_refused(world):
    world(2)
    model = tt.ddp(mlp())
    with tt.no_sync(model):
        with pytest.raises(tt.ThunderDDPError, match="already active") as e:
            with model.no_sync():
                pass
        assert e.value.kind == "no_sync"
    # usable again once left
    with tt.no_sync(model):
        pass


def test_no_sync_of_a_model_without_tracepass_ddp_is_refused(world):
    world(2)
    with pytest.raises(tt.ThunderDDPError, match="not a model made by"):
        tt.no_sync(thunder.jit(mlp()))


def test_plan_counts_frozen_and_ties(world):
    world(2)

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 8)
            self.mid = torch.nn.Linear(8, 8)
            self.frozen = torch.nn.Linear(8, 8)
            self.frozen.requires_grad_(False)
            self.head = torch.nn.Linear(8, 10, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, i):
            return self.head(self.frozen(torch.tanh(self.mid(self.emb(i)))))

    torch.manual_seed(0)
    model = tt.ddp(Tied(), bucket_size_in_mb=0)
    model(torch.randint(0, 10, (2, 5))).sum().backward()
    plan = tt.plan_of(model)
    fqns = [g["fqns"] for g in plan["gradients"]]
    assert ["emb.weight", "head.weight"] in fqns, fqns
    assert not any("frozen" in f for g in fqns for f in g), fqns
    assert len(plan["buckets"]) == 3  # the tie once, mid.weight, mid.bias


def test_fusion_regions_survive_and_are_synchronized(world):
    """With torch.compile regions (as nvFuser's on GPU) the backward is one `TorchCompile`
    region: the plan reads it through its body and the region stays as Thunder made it."""
    from thunder.executors.torch_compile import torch_compile_ex

    world(2)
    model = mlp()
    reference = mlp()
    dm = thunder.jit(
        model,
        executors=[torch_compile_ex, *thunder.get_default_executors()],
        transforms=[tt.DDP(bucket_size_in_mb=0)],
    )
    x = torch.randn(3, 8)
    with tt.CollectiveLog() as log:
        dm(x).square().mean().backward()
    assert log.all_reduces == len(tt.plan_of(dm)["buckets"]) == 4
    text = str(thunder.last_backward_traces(dm)[-1])
    assert re.search(r"= TorchCompile\d+\(", text), text
    # the fake group's all-reduce leaves each rank's own gradient: divided by the world size
    reference(x).square().mean().backward()
    for (n, p), q in zip(dm.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad / 2, msg=n)


@pytest.mark.skipif(not hasattr(tt, "DDPPlugin"), reason="this Thunder has no plugins")
def test_as_a_plugin(world):
    from thunder.recipes import BaseRecipe

    class NoFuser(BaseRecipe):
        """Thunder's base recipe without a fusion executor (nvFuser needs a GPU; torch.compile's
        regions are tested above)."""

        def setup_fuser(self) -> None:
            pass

    world(2)
    model = thunder.compile(mlp(), recipe=NoFuser(), plugins=[tt.DDPPlugin(bucket_size_in_mb=0)])
    out = model(torch.randn(3, 8))
    with tt.CollectiveLog() as log:
        out.square().mean().backward()
    assert log.all_reduces == len(tt.plan_of(model)["buckets"]) == 4
