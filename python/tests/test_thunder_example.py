"""`torchrun --standalone --nproc-per-node 2 examples/thunder_ddp.py`: the seed program with
tracepass doing Thunder's DDP trains and prints the seed's lines."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("thunder")

ROOT = Path(__file__).resolve().parents[2]


def test_seed_example_under_torchrun():
    import tracepass

    env = dict(os.environ)
    # the tracepass this test imported (the installed package in CI, python/ in a checkout)
    here = str(Path(tracepass.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([here, env.get("PYTHONPATH", "")])
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env["OMP_NUM_THREADS"] = "1"
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(ROOT / "examples" / "thunder_ddp.py")],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [l for l in run.stdout.splitlines() if l.startswith("# ")]
    assert len(lines) == 10, run.stdout
    for i, line in enumerate(lines):
        m = re.fullmatch(rf"# {i}-th loss: (-?\d+\.\d+(e-?\d+)?)", line)
        assert m, line
    losses = [float(l.split(": ")[1]) for l in lines]
    assert all(abs(v) < 1e3 for v in losses), losses
    assert len(set(losses)) > 1, losses  # new batches and AdamW steps change it
