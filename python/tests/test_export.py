"""End to end: Thunder traces small models into export directories (needs torch and Thunder).

The DDP test spawns two gloo ranks; set TRACEPASS_SKIP_DDP_TEST=1 to leave it out.
"""

import json
import os
from collections import OrderedDict

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("thunder")
pytest.importorskip("safetensors")

import torch.nn as nn  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from tracepass.export import ExportError, export  # noqa: E402
from tracepass.export.exporter import prologue_state_names  # noqa: E402
from tracepass.export.models import batch_mlp, make_mlp_frozen  # noqa: E402


class TiedLm(nn.Module):
    """Embedding, a LayerNorm and a head tied to the embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx):
        return self.head(self.norm(self.emb(idx)))


def make_tied() -> nn.Module:
    return TiedLm()


def batch_tied(gen):
    idx = torch.randint(0, 16, (2, 5), generator=gen)
    return OrderedDict(idx=idx), torch.randint(0, 16, (2, 5), generator=gen)


def read(d, name):
    return json.loads((d / name).read_text())


def test_tied_export(tmp_path):
    out = tmp_path / "tied"
    summary = export(make_tied, batch_tied, "cross_entropy", out, name="tied", steps=2, ranks=3)
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == [
        "backward.trace",
        "data.safetensors",
        "export.json",
        "forward.trace",
        "params.safetensors",
        "prologue.trace",
        "reference/grads.safetensors",
        "reference/loss.json",
        "reference/thunder_check.json",
        "reference/thunder_timing.json",
    ]
    meta = read(out, "export.json")
    assert meta["format"] == 1 and meta["model"] == "tied" and meta["loss"] == "cross_entropy"
    assert meta["tied"] == [["emb.weight", "head.weight"]]
    assert meta["world_size"] is None and meta["thunder"] == "0.2.6" and meta["torch"] == "2.9.0"

    params = load_file(str(out / "params.safetensors"))
    assert sorted(params) == ["emb.weight", "head.weight", "norm.bias", "norm.weight"]
    torch.manual_seed(0)
    fresh = make_tied()
    assert torch.equal(params["emb.weight"], fresh.emb.weight) and torch.equal(params["head.weight"], fresh.emb.weight)

    data = load_file(str(out / "data.safetensors"))
    assert sorted(data) == sorted(f"{a}.{s}.{r}" for a in ("idx", "targets") for s in range(2) for r in range(3))

    # Eager reference, recomputed here: step 0, rank 0's batch; the tie's gradient under its first name.
    logits = fresh(data["idx.0.0"])
    loss = torch.nn.functional.cross_entropy(logits.view(-1, 16), data["targets.0.0"].view(-1))
    loss.backward()
    ref = read(out, "reference/loss.json")
    assert ref["losses"] == [pytest.approx(loss.item(), rel=1e-6)] and ref["deterministic"] is True
    grads = load_file(str(out / "reference/grads.safetensors"))
    assert sorted(grads) == ["emb.weight", "norm.bias", "norm.weight"]
    assert torch.allclose(grads["emb.weight"], fresh.emb.weight.grad)

    check = read(out, "reference/thunder_check.json")
    assert check["thunder_loss"] == pytest.approx(loss.item(), rel=1e-5)
    assert check["grad_max_rel_err"] < 1e-5
    assert summary["grad_max_rel_err"] == check["grad_max_rel_err"]

    fw = (out / "forward.trace").read_text()
    assert fw.startswith("# Constructed by") and "def computation(" in fw
    assert "/site-packages/" not in fw.replace("# site-packages/", "")
    assert (out / "backward.trace").read_text().count("def backward_fn(") == 1
    assert set(prologue_state_names((out / "prologue.trace").read_text()).values()) <= set(params)


def test_frozen_parameters_have_no_gradient(tmp_path):
    out = tmp_path / "frozen"
    export(make_mlp_frozen, batch_mlp, "cross_entropy", out, name="mlp-frozen", steps=1, ranks=1)
    pro = (out / "prologue.trace").read_text()
    names = prologue_state_names(pro)
    var = {fqn: v for v, fqn in names.items()}
    # requires_grad is the last argument of check_tensor_metadata in the prologue.
    assert f"check_tensor_metadata({var['fc1.weight']}, (64, 32), 'cpu', torch.float32, False)" in pro
    assert f"check_tensor_metadata({var['fc2.weight']}, (64, 64), 'cpu', torch.float32, True)" in pro
    grads = load_file(str(out / "reference/grads.safetensors"))
    assert not {"fc1.weight", "fc1.bias", "norm1.weight", "norm1.bias"} & set(grads)
    assert {"fc2.weight", "fc3.bias", "norm2.weight"} <= set(grads)
    assert "fc1.weight" in load_file(str(out / "params.safetensors"))
    assert read(out, "reference/thunder_check.json")["grad_max_rel_err"] < 1e-5

    # The PyTorch baseline trains the export itself: its first step's loss is the reference's.
    from tracepass.export.bench_torch import bench_one

    r = bench_one(out, 1, 0, 3)
    assert r["first_loss"] == pytest.approx(read(out, "reference/loss.json")["losses"][0], rel=1e-5)
    assert r["steps_per_s"] > 0 and r["last_loss"] < r["first_loss"]


def test_bad_arguments_are_typed_errors(tmp_path):
    with pytest.raises(ExportError, match="unknown loss"):
        export(make_tied, batch_tied, "hinge", tmp_path / "x", name="x")
    with pytest.raises(ExportError, match="at least 2 ranks of data"):
        export(make_tied, batch_tied, "cross_entropy", tmp_path / "x", name="x", ddp=2, ranks=1)
    assert not (tmp_path / "x").exists()


@pytest.mark.skipif(os.environ.get("TRACEPASS_SKIP_DDP_TEST") == "1", reason="TRACEPASS_SKIP_DDP_TEST=1")
def test_ddp_export(tmp_path):
    out = tmp_path / "tied-ddp"
    export(make_tied, batch_tied, "cross_entropy", out, name="tied", ddp=2, steps=2)
    meta = read(out, "export.json")
    assert meta["world_size"] == 2 and meta["tied"] == [["emb.weight", "head.weight"]]
    bw = (out / "backward.trace").read_text()
    assert "torch_all_reduce_prim_impl" in bw and "torch_wait_prim_impl" in bw
    data = load_file(str(out / "data.safetensors"))
    assert sorted(data) == sorted(f"{a}.{s}.{r}" for a in ("idx", "targets") for s in range(2) for r in range(2))
    # Rank 0's gradients after Thunder's all-reduce are the mean of both ranks' eager gradients.
    assert read(out, "reference/thunder_check.json")["grad_max_rel_err"] < 1e-5
    timing = read(out, "reference/thunder_timing.json")
    assert timing["world_size"] == 2
    assert timing["ddp_trace_transforms"]["ddp_pass"]["calls"] == 1
    assert timing["thunder"]["total_s"] > 0 and timing["plain_thunder"]["total_s"] > 0


class AttributeTensor(nn.Module):
    """A tensor kept as a plain attribute (neither parameter nor buffer), as GPT-J keeps its
    rotary table `embed_positions`."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.fc.offset = torch.arange(3, dtype=torch.float32)

    def forward(self, x):
        return self.fc(x) + self.fc.offset


def test_tensor_attributes_are_saved_as_constants(tmp_path):
    def batch(gen):
        return OrderedDict(x=torch.randn(2, 4, generator=gen)), torch.randn(2, 3, generator=gen)

    out = tmp_path / "attr"
    export(AttributeTensor, batch, "mse", out, name="attr", steps=1, ranks=1)
    pro = (out / "prologue.trace").read_text()
    assert "fc.offset" in prologue_state_names(pro).values()
    params = load_file(str(out / "params.safetensors"))
    assert params["fc.offset"].tolist() == [0.0, 1.0, 2.0]
