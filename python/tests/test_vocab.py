"""The callee census (needs no torch)."""

from pathlib import Path

from tracepass.export.vocab import callees, main, markdown, statements, vocab

TRACE = '''# Constructed by Delete Last Used (took 3 milliseconds)
import torch
from thunder.executors.torchex import no_autocast

@torch.no_grad()
@no_autocast
def backward_fn(saved_for_backward, cotangents):
  # saved_for_backward: "collection"
  C0, C1, = saved_for_backward
  clear_mutable_collection(saved_for_backward)
  t_a, t_b, \\
  t_c, = C0
  t1 = torch.mul(t_a, t_b)  # t1: "cpu f32[4]"
    # t1 = ltorch.mul(t_a, t_b)  # t1: "cpu f32[4]"
      # t1 = prims.mul(t_a, t_b)  # t1: "cpu f32[4]"
  (t2, t3) = torch.var_mean(t1, [0], correction=0)
  [t4, t5] = torch.split(t1, 2, 0)
  t6: "cpu f32[2]" = torch.torch.ops.aten.embedding_backward(t4, t5, 4, -1, False, False)
  (t7,) = update_aliases((t6,))
  t8 = Tensor.__getitem__(t7, (slice(None, 2, None),))
  t9 = torch.mul(t8, 2.0)
  del t1
  return (t9, None)
'''


def test_statements_join_continuations_and_drop_comments():
    st = statements(TRACE)
    assert "t_a, t_b, t_c, = C0" in [" ".join(s.split()) for s in st]
    assert not any(s.startswith("#") for s in st)


def test_callees_counts_every_target_form():
    c = callees(TRACE)
    assert c == {
        "clear_mutable_collection": 1,
        "torch.mul": 2,
        "torch.var_mean": 1,
        "torch.split": 1,
        "torch.torch.ops.aten.embedding_backward": 1,
        "update_aliases": 1,
        "Tensor.__getitem__": 1,
    }
    # Decompositions in comments (ltorch.mul, prims.mul) are not statements.
    assert "prims.mul" not in c and "ltorch.mul" not in c


def test_vocab_over_export_dirs(tmp_path: Path):
    for name in ("a", "b-ddp"):
        d = tmp_path / name
        d.mkdir()
        (d / "forward.trace").write_text(TRACE)
        (d / "backward.trace").write_text("def backward_fn(x):\n  t0 = torch.neg(x)\n  return (t0,)\n")
    v, dirs = vocab([tmp_path])
    assert [d.name for d in dirs] == ["a", "b-ddp"]
    assert v["forward"]["torch.mul"] == 4
    assert v["backward"]["torch.neg"] == 2
    md = markdown(v, dirs)
    assert "| `torch.mul` | 4 | 0 | 4 | a, b-ddp |" in md
    assert "| `torch.neg` | 0 | 2 | 2 | a, b-ddp |" in md
    assert "8 callees." in md


def test_main_writes_markdown_and_rejects_missing_paths(tmp_path: Path, capsys):
    d = tmp_path / "m"
    d.mkdir()
    (d / "forward.trace").write_text(TRACE)
    out = tmp_path / "VOCAB.md"
    assert main([str(tmp_path), "--markdown", str(out)]) == 0
    assert "torch.var_mean" in out.read_text()
    assert main([str(tmp_path / "nope")]) == 1
    assert "no such path" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([str(empty)]) == 1
