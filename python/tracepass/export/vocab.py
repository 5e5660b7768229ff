"""Every distinct callee of the corpus traces, with counts.

    python -m tracepass.export.vocab testdata/models [--markdown OUT.md]

Reads `forward.trace` and `backward.trace` of every export directory below the given roots and
counts, per callee spelling (`torch.nn.functional.linear`, `Tensor.expand`, `torch_slice_prim_impl`,
...), the executable statements that call it. Comment lines (Thunder's `# t = ltorch.x(...)`
decompositions) are not statements and are not counted. Needs no torch.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

# `a = f(...)`, `a: "T" = f(...)`, `(a, b) = f(...)`, `[a, b] = f(...)`, `a, b = f(...)`, or a
# bare `f(...)`.
_CALL = re.compile(
    r"""^(?:(?:\([^=]*?\)|\[[^=]*?\]|[\w\s,]+?)(?::\s*"[^"]*")?\s*=\s*)?   # optional target
        ([A-Za-z_][\w.]*)\(""",
    re.X,
)
_SKIP = ("def ", "del ", "return ", "return(", "import ", "from ", "@", "#", "pass")


def statements(text: str) -> list[str]:
    """Executable statements of a trace, `\\` continuations joined, comments and blanks dropped."""
    out: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    if pending:
        out.append(pending)
    return out


def callees(text: str) -> Counter:
    """Callee spelling -> number of statements that call it."""
    c: Counter = Counter()
    for st in statements(text):
        if st.startswith(_SKIP):
            continue
        m = _CALL.match(st)
        if m:
            c[m.group(1)] += 1
    return c


def export_dirs(roots: list[Path]) -> list[Path]:
    dirs = set()
    for root in roots:
        if (root / "forward.trace").is_file():
            dirs.add(root)
        dirs.update(p.parent for p in root.rglob("forward.trace"))
    return sorted(dirs)


def vocab(roots: list[Path]) -> tuple[dict[str, Counter], list[Path]]:
    """{"forward": Counter, "backward": Counter, "total": Counter, per-callee model list...}"""
    dirs = export_dirs(roots)
    fw: Counter = Counter()
    bw: Counter = Counter()
    users: dict[str, set[str]] = {}
    for d in dirs:
        for kind, acc in (("forward", fw), ("backward", bw)):
            p = d / f"{kind}.trace"
            if not p.is_file():
                continue
            c = callees(p.read_text())
            acc.update(c)
            for k in c:
                users.setdefault(k, set()).add(d.name)
    return {"forward": fw, "backward": bw, "users": users}, dirs


def markdown(v: dict, dirs: list[Path]) -> str:
    fw, bw, users = v["forward"], v["backward"], v["users"]
    names = sorted(set(fw) | set(bw), key=lambda k: (-(fw[k] + bw[k]), k))
    lines = [
        "# Callees of the corpus traces",
        "",
        "Every distinct callee spelling in the `forward.trace` and `backward.trace` of "
        f"{len(dirs)} export directories ({', '.join(d.name for d in dirs)}), with the number of "
        "statements calling it. Made by `python -m tracepass.export.vocab testdata/models "
        "--markdown testdata/models/VOCAB.md`.",
        "",
        f"{len(names)} callees.",
        "",
        "| callee | forward | backward | total | models |",
        "|---|---:|---:|---:|---|",
    ]
    for k in names:
        models = sorted(users.get(k, ()))
        shown = ", ".join(models) if len(models) <= 6 else f"{len(models)} exports"
        lines.append(f"| `{k}` | {fw[k]} | {bw[k]} | {fw[k] + bw[k]} | {shown} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tracepass.export.vocab", description=__doc__.split("\n")[0])
    ap.add_argument("roots", nargs="+", type=Path, help="export directories or folders holding them")
    ap.add_argument("--markdown", type=Path, help="also write the table to this file")
    a = ap.parse_args(argv)
    missing = [str(r) for r in a.roots if not r.exists()]
    if missing:
        print(f"error: no such path: {', '.join(missing)}", file=sys.stderr)
        return 1
    v, dirs = vocab(a.roots)
    if not dirs:
        print(f"error: no forward.trace under {', '.join(map(str, a.roots))}", file=sys.stderr)
        return 1
    md = markdown(v, dirs)
    if a.markdown:
        a.markdown.write_text(md)
    print(md, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
