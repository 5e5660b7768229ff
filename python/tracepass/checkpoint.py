"""The way back to PyTorch: a checkpoint ``tracepass train --save`` (or ``tracepass.train``)
wrote, as a ``state_dict`` for the original ``nn.Module`` and the optimizer state.

The Rust runtime reads and checks the file (``tracepass._native.read_checkpoint``); this module
only turns its tensors into torch tensors. Needs torch.
"""

from __future__ import annotations

import os
from typing import Any

from . import _native

_DTYPES = {
    "float32": "float32",
    "float64": "float64",
    "bfloat16": "bfloat16",
    "float16": "float16",
    "int64": "int64",
    "int32": "int32",
    "bool": "bool",
}


def _tensor(torch: Any, dtype: str, shape: list[int], data: bytes) -> Any:
    # frombuffer shares the (read-only) bytes; clone gives the tensor its own storage
    t = torch.frombuffer(bytearray(data), dtype=getattr(torch, _DTYPES[dtype])) if data else (
        torch.empty(0, dtype=getattr(torch, _DTYPES[dtype]))
    )
    return t.reshape(shape).clone()


def load_checkpoint(
    path: str | os.PathLike[str], module: Any = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Reads a tracepass checkpoint: ``(state_dict, optim_state)``.

    ``path`` is a checkpoint file, or the manifest of a sharded one (what a ``fsdp`` run saves:
    the rank files next to it in ``PATH.shards/`` are read and put back into whole tensors).

    ``state_dict`` maps each parameter's and buffer's fully qualified name (``lm_head.weight``)
    to a tensor; tied parameters (``lm_head.weight`` and ``transformer.wte.weight``) are one
    shared tensor, as in the module.

    With ``module`` (the original ``nn.Module``), the result is ready for
    ``module.load_state_dict(state_dict, strict=True)``: the buffers the traces never read
    (a causal mask Thunder's attention does not use) are not in the checkpoint, so they come
    from the module itself; a checkpoint name the module does not have, or a shape that
    differs, raises ``CheckpointError``.

    ``optim_state`` holds ``optimizer`` (``adamw`` or ``sgd``), ``step`` (optimizer steps
    done), ``world_size`` (ranks that trained it, or None), ``tied`` (the name groups) and
    ``state``: per parameter name, ``exp_avg`` and ``exp_avg_sq`` shaped as the parameter (tied
    parameters share one entry, under each name). ``optimizer_state_dict`` turns it into a
    ``torch.optim.AdamW`` state dict.

    Raises ``CheckpointError`` (with ``file`` and ``message``) for a missing, damaged or
    foreign file.
    """
    import torch

    raw = _native.read_checkpoint(os.fspath(path))
    state_dict: dict[str, Any] = {
        name: _tensor(torch, *spec) for name, spec in raw["params"].items()
    }
    state: dict[str, dict[str, Any]] = {}
    for name, spec in raw["exp_avg"].items():
        shape = list(state_dict[name].shape) if name in state_dict else list(spec[1])
        entry = {"exp_avg": _tensor(torch, *spec).reshape(shape)}
        sq = raw["exp_avg_sq"].get(name)
        if sq is not None:
            entry["exp_avg_sq"] = _tensor(torch, *sq).reshape(shape)
        state[name] = entry
    for group in raw["tied"]:
        primary = group[0]
        if primary not in state_dict:
            raise _native.CheckpointError(
                f"{os.fspath(path)}: tie {group}: `{primary}` is not in the checkpoint"
            )
        for other in group[1:]:
            if other in state_dict:
                if not torch.equal(state_dict[other], state_dict[primary]):
                    raise _native.CheckpointError(
                        f"{os.fspath(path)}: tied parameters `{primary}` and `{other}` differ"
                    )
                state_dict[other] = state_dict[primary]
            if primary in state:
                state[other] = state[primary]
    if module is not None:
        state_dict = _complete_for(module, state_dict, os.fspath(path))
    optim_state = {
        "optimizer": raw["optimizer"],
        "step": raw["optimizer_step"],
        "checkpoint_step": raw["step"],
        "world_size": raw["world_size"],
        "tied": raw["tied"],
        "state": state,
    }
    return state_dict, optim_state


def _complete_for(module: Any, state_dict: dict[str, Any], path: str) -> dict[str, Any]:
    """``state_dict`` checked against ``module``'s and completed with its unread buffers."""
    own = module.state_dict(keep_vars=False)
    extra = sorted(set(state_dict) - set(own))
    if extra:
        raise _native.CheckpointError(
            f"{path}: holds {extra}, which {type(module).__name__} does not have"
        )
    for name, tensor in state_dict.items():
        if tuple(tensor.shape) != tuple(own[name].shape):
            raise _native.CheckpointError(
                f"{path}: `{name}` is {tuple(tensor.shape)} in the checkpoint but "
                f"{tuple(own[name].shape)} in {type(module).__name__}"
            )
    missing_params = sorted(
        n for n, _ in module.named_parameters(remove_duplicate=False) if n not in state_dict
    )
    if missing_params:
        raise _native.CheckpointError(
            f"{path}: has no value for parameters {missing_params} of {type(module).__name__}"
        )
    completed = dict(state_dict)
    for name, tensor in own.items():
        completed.setdefault(name, tensor.detach().clone())
    return completed


def optimizer_state_dict(optim_state: dict[str, Any], module: Any, optimizer: Any) -> dict[str, Any]:
    """``optim_state`` (from ``load_checkpoint``) as a state dict for ``optimizer``, an
    optimizer over ``module.parameters()``: its moments are placed by parameter identity, the
    hyperparameters are the optimizer's own.
    """
    import torch

    names = {id(p): n for n, p in module.named_parameters()}
    sd = optimizer.state_dict()
    state: dict[int, dict[str, Any]] = {}
    index = 0
    for group, saved_group in zip(optimizer.param_groups, sd["param_groups"]):
        for p, i in zip(group["params"], saved_group["params"]):
            entry = optim_state["state"].get(names.get(id(p), ""))
            if entry is not None:
                state[i] = {
                    "step": torch.tensor(float(optim_state["step"])),
                    **{k: v.clone() for k, v in entry.items()},
                }
            index += 1
    return {"state": state, "param_groups": sd["param_groups"]}
