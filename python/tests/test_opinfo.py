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


def test_other_dtypes_add_to_the_corpus_already_there(tmp_path):
    probe(tmp_path, {"add"}, 1, {"f32"})
    f32_inputs = (tmp_path / "add" / "f32-0" / "inputs.safetensors").read_bytes()
    # a rerun of the same op in other dtypes (`--part extra`) merges beside float32
    index = probe(tmp_path, {"add"}, 1, {"f16", "i64"}, (0, 0))
    assert sorted(index["tried"]) == [["add", "f16"], ["add", "i64"]]
    index = merge(tmp_path)
    assert {s["dtype"] for s in index["samples"]} == {"f32", "f16", "i64"}
    assert (tmp_path / "add" / "f32-0" / "inputs.safetensors").read_bytes() == f32_inputs
    by_dtype = {s["dtype"]: s for s in index["samples"]}
    # integer samples run without gradients; float16 ones with them
    assert not by_dtype["i64"]["backward"] and by_dtype["f16"]["backward"]
    ints = load_file(str(tmp_path / "add" / "i64-0" / "inputs.safetensors"))
    assert all(t.dtype == torch.int64 for t in ints.values())
    expected = load_file(str(tmp_path / "add" / "i64-0" / "expected.safetensors"))
    assert torch.equal(expected["output.0"], ints["t_0"] + ints["t_1"])
    assert not (tmp_path / "add" / "i64-0" / "backward.trace").exists()


def test_dtypes_cover_floats_with_gradients_and_integers_without():
    from tracepass.export.opinfo import DTYPES

    grads = {tag: grad for _, tag, _, grad in DTYPES}
    assert grads == {"f32": True, "f64": True, "bf16": True, "f16": True, "i64": False, "i32": False, "b8": False}
