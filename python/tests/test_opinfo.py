"""The OpInfo probe: samples of a few ops jitted by Thunder and written as tracepass inputs
(needs torch and Thunder)."""

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("thunder")
pytest.importorskip("safetensors")

from safetensors.torch import load_file  # noqa: E402

from tracepass.export.opinfo import merge, probe  # noqa: E402


def test_probe_writes_traces_inputs_and_pytorch_numbers(tmp_path):
    index = probe(tmp_path, {"add", "topk"}, 1, {"f32"})
    assert index["ops"] == 2
    by_op = {s["op"]: s for s in index["samples"]}
    assert set(by_op) == {"add", "topk"}
    add = tmp_path / "add" / "f32-0"
    assert "def computation(" in (add / "forward.trace").read_text()
    assert "def backward_fn(" in (add / "backward.trace").read_text()
    inputs = load_file(str(add / "inputs.safetensors"))
    expected = load_file(str(add / "expected.safetensors"))
    a, b = inputs["t_0"], inputs["t_1"]
    torch.testing.assert_close(expected["output.0"], a + b)
    # d(sum(cot * (a + b)))/da is the cotangent itself
    torch.testing.assert_close(expected["grad.t_0"], inputs["cotangents.0"])
    # topk's second output (indices) is an integer: its cotangent is zeros
    topk = load_file(str(tmp_path / "topk" / "f32-0" / "inputs.safetensors"))
    assert not topk["cotangents.1"].is_floating_point()
    assert json.loads((tmp_path / "index.json").read_text())["ops"] == 2


def test_parts_merge_into_one_index(tmp_path):
    probe(tmp_path, {"add", "sub", "mul"}, 1, {"f32"}, (0, 2))
    probe(tmp_path, {"add", "sub", "mul"}, 1, {"f32"}, (1, 2))
    index = merge(tmp_path)
    assert index["ops"] == 3
    assert not list(tmp_path.glob("index.part*.json"))
    assert sorted({s["op"] for s in index["samples"]}) == ["add", "mul", "sub"]
