"""The exceptions tracepass raises. Each keeps the Rust message as its text; the structured
parts are attributes:

- ``ParseError``: ``message``, ``file`` (None for text), ``line``, ``col``, ``text``
- ``VerifyError``: ``trace``, ``violations`` (dicts with ``statement``, ``message``, ``line``),
  ``pass_name`` (the pass after which the IR was invalid, or None: the input)
- ``FileError``, ``ProgramError``, ``CheckpointError``: ``file``, ``message``
- ``PipelineError``: ``message`` (unknown pass or option, bad value, syntax)
- ``PassError``: ``pass_name``, ``message``, ``reproducer``
- ``SimulateError``, ``TrainError``: ``message``

All derive from ``TracepassError``.
"""

from ._native import (
    CheckpointError,
    FileError,
    ParseError,
    PassError,
    PipelineError,
    ProgramError,
    SimulateError,
    TracepassError,
    TrainError,
    VerifyError,
)

__all__ = [
    "CheckpointError",
    "FileError",
    "ParseError",
    "PassError",
    "PipelineError",
    "ProgramError",
    "SimulateError",
    "TracepassError",
    "TrainError",
    "VerifyError",
]
