"""The way back to PyTorch: nanoGPT (tied embedding and head) trained by tracepass through the
bindings, its checkpoint loaded into the original `nn.Module` with `strict=True`, and the loss
PyTorch computes with it equal to the loss tracepass computes when it resumes there."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("thunder")  # the nanoGPT definition is Thunder's
pytest.importorskip("safetensors")

import tracepass as tp  # noqa: E402
from tracepass.export.models import make_mlp, make_nanogpt  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NANOGPT = ROOT / "testdata" / "models" / "nanogpt"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two AdamW steps on one rank, checkpointed, and the run resumed for a third step."""
    ck = tmp_path_factory.mktemp("ck") / "nanogpt.safetensors"
    first = tp.train(str(NANOGPT), steps=2, world_size=1, save=str(ck))
    resumed = tp.train(str(NANOGPT), steps=3, world_size=1, resume=str(ck))
    assert resumed["first_step"] == 2 and len(resumed["losses"]) == 1
    return ck, first, resumed


def test_a_trained_checkpoint_loads_strictly_into_the_original_module(trained):
    ck, _, resumed = trained
    model = make_nanogpt()
    state_dict, optim_state = tp.load_checkpoint(ck, module=model)
    result = model.load_state_dict(state_dict, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    # the tie survives: one tensor in the state dict and in the module
    assert state_dict["lm_head.weight"] is state_dict["transformer.wte.weight"]
    assert model.lm_head.weight is model.transformer.wte.weight
    # every trained value is the checkpoint's, and training moved it from the export's
    from safetensors.torch import load_file

    initial = load_file(str(NANOGPT / "params.safetensors"))
    params = dict(model.named_parameters())
    raw = tp.read_checkpoint(str(ck))["params"]
    assert set(raw) <= set(model.state_dict())
    for name in raw:
        if name in params:
            assert torch.equal(params[name].detach(), state_dict[name]), name
    assert not torch.equal(params["transformer.h.0.attn.c_attn.weight"].detach(), initial["transformer.h.0.attn.c_attn.weight"])

    # PyTorch's loss with the loaded weights is the one tracepass computes resuming there
    data = load_file(str(NANOGPT / "data.safetensors"))
    model.eval()
    with torch.no_grad():
        _, loss = model(data["idx.2.0"], data["targets.2.0"])
    assert float(loss) == pytest.approx(resumed["losses"][0], rel=1e-5)

    assert optim_state["optimizer"] == "adamw" and optim_state["step"] == 2
    assert optim_state["tied"] == [["transformer.wte.weight", "lm_head.weight"]]
    wte = optim_state["state"]["transformer.wte.weight"]
    assert wte["exp_avg"].shape == params["transformer.wte.weight"].shape
    assert optim_state["state"]["lm_head.weight"] is wte


def test_the_optimizer_state_loads_into_torch_adamw(trained):
    ck, _, _ = trained
    model = make_nanogpt()
    state_dict, optim_state = tp.load_checkpoint(ck, module=model)
    model.load_state_dict(state_dict, strict=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt.load_state_dict(tp.optimizer_state_dict(optim_state, model, opt))
    by_name = {n: p for n, p in model.named_parameters()}
    moments = opt.state[by_name["transformer.h.1.mlp.c_fc.weight"]]
    assert torch.equal(moments["exp_avg"], optim_state["state"]["transformer.h.1.mlp.c_fc.weight"]["exp_avg"])
    assert float(moments["step"]) == 2.0


def test_a_checkpoint_read_alone_keeps_every_name(trained):
    ck, first, _ = trained
    state_dict, _ = tp.load_checkpoint(ck)
    assert sorted(state_dict) == sorted(first["param_names"])
    assert state_dict["lm_head.weight"] is state_dict["transformer.wte.weight"]


def test_a_wrong_file_or_module_is_a_checkpoint_error(trained, tmp_path):
    ck, _, _ = trained
    with pytest.raises(tp.CheckpointError) as e:
        tp.load_checkpoint(NANOGPT / "params.safetensors")
    assert "not a tracepass checkpoint" in str(e.value)
    assert e.value.file == str(NANOGPT / "params.safetensors")
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not safetensors at all")
    with pytest.raises(tp.CheckpointError):
        tp.load_checkpoint(garbage)
    with pytest.raises(tp.CheckpointError, match="does not have"):
        tp.load_checkpoint(ck, module=make_mlp())


def test_a_sharded_checkpoint_loads_as_the_whole_one(tmp_path):
    """An fsdp run saves shards (a manifest and one file per rank); load_checkpoint puts them
    back together: the same tensors a DDP run of the same steps saves whole."""
    sharded = tmp_path / "sharded.ck"
    whole = tmp_path / "whole.safetensors"
    tp.train(str(NANOGPT), steps=2, world_size=2, save=str(sharded),
             passes="fsdp(world_size=2,sharding=zero3,bucket_mb=0.01)")
    assert sharded.read_bytes().startswith(b"{")
    assert len(list((tmp_path / "sharded.ck.shards").iterdir())) == 2
    tp.train(str(NANOGPT), steps=2, world_size=2, save=str(whole))
    model = make_nanogpt()
    got, got_opt = tp.load_checkpoint(sharded, module=model)
    result = model.load_state_dict(got, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    assert got["lm_head.weight"] is got["transformer.wte.weight"]
    want, want_opt = tp.load_checkpoint(whole)
    assert got_opt["step"] == want_opt["step"] == 2 and got_opt["world_size"] == 2
    for name, t in want.items():
        scale = max(float(t.abs().max()), 1e-30)
        assert float((got[name] - t).abs().max()) <= 1e-6 * scale, name
    # a missing rank file is a CheckpointError naming it
    victim = sorted((tmp_path / "sharded.ck.shards").iterdir())[1]
    victim.unlink()
    with pytest.raises(tp.CheckpointError, match="missing") as e:
        tp.load_checkpoint(sharded)
    assert victim.name in str(e.value)
