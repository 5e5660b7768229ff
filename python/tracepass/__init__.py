"""tracepass from Python: parse, print, verify and rewrite Lightning Thunder's training traces,
run pass pipelines, simulate steps, train, and load trained checkpoints back into PyTorch.

The Rust core is called through the native module ``tracepass._native``; nothing here runs the
``tracepass`` command line. ``tracepass.export`` (the exporter), ``load_checkpoint`` and
``tracepass.thunder`` need torch (and Thunder); ``import tracepass`` imports neither.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._native import (
    PipelineResult,
    Program,
    Statement,
    Trace,
    __version__,
    load_program,
    parse_trace,
    passes,
    passes_help,
    print_trace,
    read_checkpoint,
    register_pass,
    run_pipeline,
    simulate,
    train,
)
from . import errors as _errors
from .checkpoint import load_checkpoint, optimizer_state_dict
from .errors import *  # noqa: F403 (every exception, as `errors.__all__` lists them)


def load_trace(path: str, forward: bool = False) -> Trace:
    """Reads a ``.trace``, ``.tpb`` or ``.json`` trace (of a program file, its backward, or
    its forward when ``forward``)."""
    return Trace.load(path, forward)


def verify(target: Trace | Program) -> None:
    """Raises ``VerifyError`` (every violation, each with its line) if ``target`` is invalid."""
    target.verify()


# Submodules that import torch or Thunder load on first use, never at `import tracepass`.
_LAZY_MODULES = ("thunder", "export", "bench")
# What `tracepass.thunder` exposes, reachable as `tracepass.<name>` (importing Thunder then).
_THUNDER_NAMES = ("DDP", "DDPPlugin", "ddp", "no_sync", "plan_of", "CollectiveLog")


def __getattr__(name: str) -> Any:
    if name in _LAZY_MODULES:
        module = importlib.import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    if name in _THUNDER_NAMES:
        value = getattr(importlib.import_module(".thunder", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tracepass' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_MODULES) | set(_THUNDER_NAMES))


__all__ = _errors.__all__ + [
    "PipelineResult",
    "Program",
    "Statement",
    "Trace",
    "__version__",
    "load_checkpoint",
    "load_program",
    "load_trace",
    "optimizer_state_dict",
    "parse_trace",
    "passes",
    "passes_help",
    "print_trace",
    "read_checkpoint",
    "register_pass",
    "run_pipeline",
    "simulate",
    "train",
    "verify",
]
