"""The exceptions tracepass raises, all derived from ``TracepassError``. Each keeps the Rust
message as its text; the structured parts are attributes:

- ``ParseError``: ``message``, ``file`` (None for text), ``line``, ``col``, ``text``
- ``VerifyError``: ``trace``, ``violations`` (dicts with ``statement``, ``message``, ``line``),
  ``pass_name`` (the pass after which the IR was invalid, or None: the input)
- ``FileError``, ``ProgramError``, ``CheckpointError``: ``file``, ``message``
- ``PipelineError``: ``message`` (unknown pass or option, bad value, syntax)
- ``PassError``: ``pass_name``, ``message``, ``reproducer``
- ``PlanError``: ``kind``, ``message``, ``file`` (None), ``line`` (of the backward, or None)
- ``SimulateError``, ``TrainError``: ``message``
- ``ThunderDDPError`` (raised by ``tracepass.thunder``): ``kind``, ``message``, ``file``,
  ``line``

Every class but ``ThunderDDPError`` is made by the native module (`python/src/errors.rs`, one
class per error type of the Rust crates); ``__all__`` is derived from what is here, and
``tracepass`` re-exports it.
"""

from __future__ import annotations

from ._native import (
    CheckpointError,
    FileError,
    ParseError,
    PassError,
    PipelineError,
    PlanError,
    ProgramError,
    SimulateError,
    TracepassError,
    TrainError,
    VerifyError,
)


class ThunderDDPError(TracepassError):
    """tracepass cannot synchronize this model's gradients in Thunder: the message names the
    op, parameter or setting, and the line of the backward where it applies. ``kind`` is
    ``parse`` (the backward does not parse), ``options``, ``gradients`` (parameters and
    backward disagree), ``mapping`` (the plan does not map onto Thunder's trace) or
    ``no_sync``; ``line`` is that line of Thunder's backward (or None), ``file`` is None (a
    trace in memory)."""

    def __init__(self, message: str, kind: str = "mapping", line: int | None = None, file: str | None = None):
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.line = line
        self.file = file


__all__ = sorted(
    name for name, value in globals().items() if isinstance(value, type) and issubclass(value, TracepassError)
)
