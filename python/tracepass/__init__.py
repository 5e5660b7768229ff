"""tracepass from Python: parse, print, verify and rewrite Lightning Thunder's training traces,
run pass pipelines, simulate steps and load trained checkpoints back into PyTorch.

The Rust core is called through the native module ``tracepass._native``; nothing here runs the
``tracepass`` command line.
"""

from ._native import Statement, Trace, __version__, parse_trace, print_trace
from .errors import (
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
    "Statement",
    "Trace",
    "TracepassError",
    "TrainError",
    "VerifyError",
    "__version__",
    "parse_trace",
    "print_trace",
]
