"""python -m tracepass.export --model NAME --out DIR [--ddp N]"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    from .mid_models import MID_MODELS
    from .models import MODELS

    MODELS = {**MODELS, **MID_MODELS}

    ap = argparse.ArgumentParser(prog="python -m tracepass.export", description=__doc__)
    ap.add_argument("--model", required=True, help=f"one of: {', '.join(MODELS)}")
    ap.add_argument("--out", required=True, help="export directory to write (replaced if it exists)")
    ap.add_argument("--ddp", type=int, default=None, help="trace thunder.distributed.ddp on N gloo ranks")
    ap.add_argument("--steps", type=int, default=4, help="batches per rank in data.safetensors")
    ap.add_argument("--ranks", type=int, default=None, help="ranks of data (default 4, or N with --ddp)")
    ap.add_argument(
        "--timing-repeats", type=int, default=1, help="with --ddp: compile plain and DDP N times, keep the fastest"
    )
    a = ap.parse_args(argv)

    spec = MODELS.get(a.model)
    if spec is None:
        ap.error(f"unknown model `{a.model}`; valid: {', '.join(MODELS)}")
    from .exporter import ExportError, export

    name = spec.name
    try:
        summary = export(
            spec.factory,
            spec.batch,
            spec.loss,
            a.out,
            name=name,
            output=spec.output,
            ddp=a.ddp,
            steps=a.steps,
            ranks=a.ranks,
            deterministic=spec.deterministic,
            timing_repeats=a.timing_repeats,
        )
    except ExportError as e:
        print(f"error: exporting {name}: {e}", file=sys.stderr)
        return 1
    t = summary["timing"]["thunder"]
    line = {
        "model": name,
        "out": summary["out_dir"],
        "eager_loss": round(summary["eager_loss"], 6),
        "thunder_loss": round(summary["thunder_loss"], 6),
        "grad_max_rel_err": summary["grad_max_rel_err"],
        "thunder_total_s": round(t["total_s"], 3),
    }
    if a.ddp:
        line["ddp_overhead_s"] = round(summary["timing"]["ddp_overhead_s"], 3)
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
