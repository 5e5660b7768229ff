"""The exporter's and the benchmark's pure helpers (need torch, not Thunder)."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

import torch.nn as nn  # noqa: E402

from tracepass.export.bench_torch import BenchError, batches_of, load_params  # noqa: E402
from tracepass.export.exporter import (  # noqa: E402
    ExportError,
    check_signature,
    compute_loss,
    data_tensors,
    make_batches,
    pick_output,
    portable_source_paths,
    prologue_state_names,
    rel_err,
    snapshot_state,
    tied_groups,
)
from tracepass.export.models import batch_bert, batch_mlp  # noqa: E402


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(8, 4)
        self.head = nn.Linear(4, 8, bias=False)
        self.head.weight = self.emb.weight
        # Same shape and a name pattern like the tied pair, but its own tensor: not tied.
        self.other = nn.Linear(4, 8, bias=False)
        self.register_buffer("scale", torch.ones(4), persistent=False)


def test_ties_are_found_by_identity_not_by_name():
    assert tied_groups(Tied()) == [["emb.weight", "head.weight"]]
    assert tied_groups(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))) == []


def test_snapshot_has_every_name_of_a_tie_and_non_persistent_buffers():
    m = Tied()
    s = snapshot_state(m)
    assert list(s) == ["emb.weight", "head.weight", "other.weight", "scale"]
    assert torch.equal(s["emb.weight"], s["head.weight"])
    # Copies: the snapshot does not move with the model.
    with torch.no_grad():
        m.emb.weight.add_(1.0)
    assert not torch.equal(s["emb.weight"], m.emb.weight)


def test_batches_are_reproducible_and_step_major():
    a = make_batches(batch_mlp, 2, 3, seed=7)
    b = make_batches(batch_mlp, 2, 3, seed=7)
    assert sorted(a) == [(s, r) for s in range(2) for r in range(3)]
    for k in a:
        assert torch.equal(a[k][0]["x"], b[k][0]["x"]) and torch.equal(a[k][1], b[k][1])
    assert not torch.equal(a[(0, 0)][0]["x"], a[(0, 1)][0]["x"])
    d = data_tensors(a)
    assert sorted(d) == sorted([f"x.{s}.{r}" for s in range(2) for r in range(3)] + [f"targets.{s}.{r}" for s in range(2) for r in range(3)])


def test_bert_batch_has_a_padded_row():
    args, targets = batch_bert(torch.Generator().manual_seed(0))
    assert list(args) == ["input_ids", "attention_mask"]
    mask = args["attention_mask"]
    assert mask.dtype == torch.int64 and mask[0].all() and not mask[1].all()
    assert targets.shape == (2,)


def test_losses():
    out = torch.tensor([[[2.0, 0.0], [0.0, 2.0]]])  # [1, 2, 2]: cross-entropy over leading dims
    t = torch.tensor([[0, 1]])
    want = torch.nn.functional.cross_entropy(out.view(-1, 2), t.view(-1))
    assert torch.equal(compute_loss("cross_entropy", out, t), want)
    assert compute_loss("sum", out, None).item() == 4.0
    assert compute_loss("mse", out, torch.zeros_like(out)).item() == 2.0
    with pytest.raises(ExportError, match="unknown loss `l1`"):
        compute_loss("l1", out, t)


def test_pick_output():
    x = torch.zeros(1)
    assert pick_output(x, 0) is x
    assert pick_output((x, 1), 0) is x
    with pytest.raises(ExportError, match="out of range"):
        pick_output((x,), 1)
    with pytest.raises(ExportError, match="is a int"):
        pick_output((x, 1), 1)
    with pytest.raises(ExportError, match="expected a tensor"):
        pick_output({"logits": x}, 0)


PROLOGUE = """  weight: "cpu f32[8, 3, 3, 3]" = module.get_parameter('conv1.weight')
  t_bn1_running_mean: "cpu f32[8]" = module.get_buffer('bn1.running_mean')
"""
FORWARD = "def computation(x, t_bn1_running_mean, weight):\n  return x\n"


def test_signature_check():
    assert prologue_state_names(PROLOGUE) == {"weight": "conv1.weight", "t_bn1_running_mean": "bn1.running_mean"}
    state = {"conv1.weight": 0, "bn1.running_mean": 0}
    check_signature(FORWARD, PROLOGUE, ["x"], state)
    with pytest.raises(ExportError, match=r"data arguments \['idx'\]"):
        check_signature(FORWARD, PROLOGUE, ["idx"], state)
    with pytest.raises(ExportError, match=r"forward arguments \['y'\]"):
        check_signature(FORWARD.replace("(x,", "(x, y,"), PROLOGUE, ["x"], state)
    with pytest.raises(ExportError, match="conv1.weight"):
        check_signature(FORWARD, PROLOGUE, ["x"], {"bn1.running_mean": 0})


def test_source_paths_are_cut_in_comments_only():
    text = (
        "  # /opt/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py:134: \treturn F.linear(x)\n"
        '  t0 = torch.neg(x)  # t0: "cpu f32[2]"\n'
    )
    out = portable_source_paths(text)
    assert out.splitlines()[0] == "  # site-packages/torch/nn/modules/linear.py:134: \treturn F.linear(x)"
    assert out.splitlines()[1] == text.splitlines()[1]


def test_rel_err():
    assert rel_err(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 4.0])) == 0.5
    assert rel_err(torch.zeros(2), torch.zeros(2)) == 0.0


def test_bench_batches_and_params():
    data = {
        "x.0.0": torch.zeros(1),
        "x.1.0": torch.ones(1),
        "x.0.1": torch.full((1,), 2.0),
        "targets.0.0": torch.tensor([0]),
        "targets.1.0": torch.tensor([1]),
    }
    b = batches_of(data, 0)
    assert [float(a["x"]) for a, _ in b] == [0.0, 1.0] and [int(t) for _, t in b] == [0, 1]
    with pytest.raises(BenchError, match="no batch for rank 3"):
        batches_of(data, 3)
    with pytest.raises(BenchError, match="not <arg>.<step>.<rank>"):
        batches_of({"x.0": torch.zeros(1)}, 0)
    m = Tied()
    load_params(m, {"emb.weight": torch.zeros(8, 4), "scale": torch.full((4,), 3.0)})
    assert m.head.weight.abs().sum() == 0 and m.scale.sum() == 12
    with pytest.raises(BenchError, match="lacks"):
        load_params(m, {"nope.weight": torch.zeros(1)})
    with pytest.raises(BenchError, match="shape"):
        load_params(m, {"emb.weight": torch.zeros(2)})


def test_init_params_writes_what_both_readers_load_alike(tmp_path, monkeypatch):
    import builtins
    import shutil
    from pathlib import Path

    from safetensors.torch import load_file

    from tracepass.export.bench_torch import init_params, load_tensors
    from tracepass.export.models import MODELS

    d = tmp_path / "mlp"
    d.mkdir()
    shutil.copy("testdata/models/mlp/export.json", d / "export.json")
    written = init_params(d)
    torch.manual_seed(0)
    want = MODELS["mlp"].factory().state_dict()
    got = load_file(str(written))
    assert set(got) == set(want)
    for k, v in want.items():
        assert torch.equal(got[k], v), k
    # a second call would overwrite: refused
    with pytest.raises(BenchError, match="exists"):
        init_params(d)
    # the reader without the safetensors package gives the same tensors
    real_import = builtins.__import__

    def no_safetensors(name, *args, **kwargs):
        if name.startswith("safetensors"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_safetensors)
    fallback = load_tensors(written)
    monkeypatch.undo()
    assert set(fallback) == set(got)
    for k, v in got.items():
        assert fallback[k].dtype == v.dtype and torch.equal(fallback[k], v), k
    # the data file (int64 tokens, several dtypes) through the fallback too
    data = "testdata/models/nanogpt/data.safetensors"
    monkeypatch.setattr(builtins, "__import__", no_safetensors)
    fb = load_tensors(Path(data))
    monkeypatch.undo()
    ref = load_file(data)
    assert set(fb) == set(ref) and all(torch.equal(fb[k], ref[k]) for k in ref)
