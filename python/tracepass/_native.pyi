"""Type stubs of the native module ``tracepass._native`` (Rust, PyO3). The package
``tracepass`` re-exports everything here; import from ``tracepass``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, TypedDict

__version__: str

_PathLike = str | os.PathLike[str]

class TracepassError(Exception):
    """Base class of every error tracepass raises."""

class ParseError(TracepassError):
    message: str
    file: str | None
    line: int
    col: int
    text: str

class Violation(TypedDict):
    statement: str
    message: str
    line: int | None

class VerifyError(TracepassError):
    trace: str
    violations: list[Violation]
    pass_name: str | None

class FileError(TracepassError):
    file: str
    message: str

class ProgramError(TracepassError):
    file: str | None
    message: str

class PipelineError(TracepassError):
    message: str

class PassError(TracepassError):
    pass_name: str
    message: str
    reproducer: str | None

class CheckpointError(TracepassError):
    file: str
    message: str

class SimulateError(TracepassError):
    message: str

class TrainError(TracepassError):
    message: str

class PlanError(TracepassError):
    kind: str
    message: str
    file: str | None
    line: int | None

class Statement:
    """One statement: its canonical op, operands, outputs, text and line in ``str(trace)``."""

    @property
    def op(self) -> str: ...
    @property
    def inputs(self) -> list[str]: ...
    @property
    def outputs(self) -> list[str]: ...
    @property
    def kwargs(self) -> list[str]: ...
    @property
    def text(self) -> str: ...
    @property
    def line(self) -> int | None: ...

class Trace:
    """A trace; ``str(trace)`` prints it as Thunder does."""

    @staticmethod
    def parse(text: str) -> Trace: ...
    @staticmethod
    def load(path: _PathLike, forward: bool = False) -> Trace: ...
    def save(self, path: _PathLike) -> None: ...
    def verify(self) -> None: ...
    def violations(self) -> list[Violation]: ...
    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str:
        """``forward``, ``backward``, ``joint`` or ``computation``."""
    @property
    def args(self) -> list[str]: ...
    @property
    def returns(self) -> list[str]: ...
    @property
    def provenance(self) -> list[dict[str, Any]]:
        """Dicts with ``pass`` and ``millis``, oldest first."""
    @property
    def statements(self) -> list[Statement]: ...
    @property
    def ops(self) -> list[str]: ...
    def type_of(self, name: str) -> str | None: ...
    def to_dot(self) -> str: ...
    def __len__(self) -> int: ...
    def __eq__(self, other: object) -> bool: ...

class Program:
    """Forward + backward + parameters."""

    @staticmethod
    def load(path: _PathLike) -> Program: ...
    @staticmethod
    def from_traces(forward: Trace, backward: Trace, prologue: str | None = None) -> Program: ...
    def save(self, path: _PathLike) -> None: ...
    def verify(self) -> None: ...
    @property
    def forward(self) -> Trace: ...
    @property
    def backward(self) -> Trace: ...
    @property
    def params(self) -> list[dict[str, Any]]:
        """Dicts with ``fqn``, ``forward_arg``, ``grad_output``, ``shape``, ``dtype``,
        ``device``, ``requires_grad``, ``tied_to``, ``buffer``."""
    @property
    def ties(self) -> list[list[str]]: ...
    @property
    def export_dir(self) -> Path | None: ...
    @property
    def export_info(self) -> dict[str, Any] | None: ...

class PipelineResult:
    @property
    def program(self) -> Program | None: ...
    @property
    def trace(self) -> Trace: ...
    @property
    def pipeline(self) -> str: ...
    @property
    def stats(self) -> list[dict[str, Any]]:
        """Dicts with ``pass``, ``spec``, ``trace``, ``name``, ``value``."""
    @property
    def notes(self) -> list[dict[str, Any]]: ...
    @property
    def timings(self) -> list[dict[str, Any]]: ...
    @property
    def provenance(self) -> dict[str, list[dict[str, Any]]]: ...
    def stat(self, name: str) -> int | None: ...

def parse_trace(text: str) -> Trace: ...
def print_trace(trace: Trace) -> str: ...
def load_program(path: _PathLike) -> Program: ...
def run_pipeline(
    target: Program | Trace,
    pipeline: str,
    verify: bool = True,
    reproducer_dir: _PathLike | None = None,
) -> PipelineResult: ...
def register_pass(
    name: str,
    func: Callable[[Trace, dict[str, Any]], Trace | None | tuple[Trace | None, dict[str, int]]],
    help: str = "",
    options: dict[str, int | float | str | bool | None] | None = None,
) -> None: ...
def passes() -> list[dict[str, Any]]: ...
def passes_help() -> str: ...
def simulate(
    target: Program | Trace,
    world_size: int,
    device: str = "h100",
    link: str = "nvlink",
    passes: str | None = None,
) -> dict[str, Any]: ...
def train(
    model: Program | _PathLike,
    steps: int,
    world_size: int = 1,
    passes: str | None = None,
    bucket_mb: float = 25.0,
    seed: int = 0,
    save: _PathLike | None = None,
    save_every: int | None = None,
    resume: _PathLike | None = None,
    params: _PathLike | None = None,
    data: _PathLike | None = None,
) -> dict[str, Any]: ...
def read_checkpoint(path: _PathLike) -> dict[str, Any]: ...
def plan_ddp(
    backward: str,
    params: list[tuple[str, int | None, bool, str | None]],
    world_size: int,
    bucket_mb: float,
) -> dict[str, Any]: ...
