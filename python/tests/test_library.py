"""The library from Python, for compiler authors: traces and programs, pipelines of built-in
and registered passes, statistics, provenance, simulation, and typed errors. Runs against the
installed package (`pip install ./python`); needs neither torch nor Thunder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import tracepass as tp

ROOT = Path(__file__).resolve().parents[2]
NANOGPT = ROOT / "testdata" / "models" / "nanogpt"
MLP = ROOT / "testdata" / "thunder" / "mlp"

NEG = """def f(x):
  # x: "cpu f32[4]"
  a = prims.neg(x)  # a: "cpu f32[4]"
  b = prims.mul(a, a)  # b: "cpu f32[4]"
  return b
"""


def test_import_loads_neither_torch_nor_thunder():
    code = "import sys, tracepass; tracepass.parse_trace; print(sorted(m for m in ('torch', 'thunder') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_trace_parses_prints_and_reads_back_the_same():
    t = tp.parse_trace(NEG)
    assert (t.name, t.kind, t.args, t.returns) == ("f", "computation", ["x"], ["b"])
    assert t.ops == ["prims.neg", "prims.mul"]
    assert len(t) == 2
    text = str(t)
    assert "a = prims.neg(x)" in text and "b = prims.mul(a, a)" in text
    again = tp.parse_trace(text)
    assert str(again) == text and again == t
    assert tp.print_trace(t) == text
    s = t.statements[1]
    assert (s.op, s.inputs, s.outputs) == ("prims.mul", ["a", "a"], ["b"])
    # each statement knows its line in the printed trace
    assert text.splitlines()[s.line - 1].strip().startswith("b = prims.mul(a, a)")
    assert t.type_of("b") == "cpu f32[4]" and t.type_of("nope") is None
    t.verify()
    assert t.violations() == []


def test_a_trace_file_loads_and_saves_in_every_format(tmp_path):
    t = tp.load_trace(str(MLP / "backward.trace"))
    assert t.kind == "backward" or t.name.startswith("backward")
    for ext in ("trace", "tpb", "json"):
        path = tmp_path / f"b.{ext}"
        t.save(str(path))
        assert str(tp.Trace.load(str(path))) == str(t)


def test_a_parse_error_keeps_message_file_and_line(tmp_path):
    bad = "def f(x):\n  # x: \"cpu f32[4]\"\n  a = prims.no_such_op(x)\n  return a\n"
    with pytest.raises(tp.ParseError) as e:
        tp.parse_trace(bad)
    assert e.value.line == 3 and e.value.file is None
    assert "prims.no_such_op" in e.value.message and "prims.no_such_op" in str(e.value)
    assert isinstance(e.value, tp.TracepassError)

    path = tmp_path / "bad.trace"
    path.write_text(bad)
    with pytest.raises(tp.ParseError) as e:
        tp.Trace.load(str(path))
    assert (e.value.file, e.value.line) == (str(path), 3)
    assert str(path) in str(e.value)

    with pytest.raises(tp.FileError) as e:
        tp.Trace.load(str(tmp_path / "missing.trace"))
    assert e.value.file == str(tmp_path / "missing.trace")


def test_a_verify_error_lists_every_violation_with_its_line():
    t = tp.parse_trace(
        'def f(x):\n  # x: "cpu f32[4]"\n  a = prims.neg(x)  # a: "cpu f32[5]"\n'
        '  b = prims.add(a, x)  # b: "cpu f32[6]"\n  return b\n'
    )
    with pytest.raises(tp.VerifyError) as e:
        t.verify()
    v = e.value.violations
    assert e.value.trace == "f" and e.value.pass_name is None
    assert len(v) >= 2, v
    lines = str(t).splitlines()
    for item in v:
        assert item["message"] and item["line"] is not None
        assert lines[item["line"] - 1].strip() == item["statement"].strip()
    assert t.violations() == v


def test_an_export_directory_loads_as_a_program():
    p = tp.load_program(str(NANOGPT))
    assert p.forward.kind == "forward" and p.backward.kind == "backward"
    assert len(p.params) == 29
    assert p.ties == [["transformer.wte.weight", "lm_head.weight"]]
    wte = next(q for q in p.params if q["fqn"] == "lm_head.weight")
    assert wte["tied_to"] == "transformer.wte.weight" and wte["requires_grad"]
    assert p.export_info["model"] == "nanogpt" and p.export_dir == NANOGPT
    p.verify()
    with pytest.raises(tp.FileError):
        tp.Program.load(str(MLP / "backward.trace"))


def test_a_program_pairs_two_traces():
    p = tp.Program.from_traces(
        tp.load_trace(str(MLP / "forward.trace")), tp.load_trace(str(MLP / "backward.trace"))
    )
    assert sorted(q["fqn"] for q in p.params) == ["l1.bias", "l1.weight", "l2.bias", "l2.weight"]
    # another model's backward returns another number of gradients
    with pytest.raises(tp.ProgramError, match="gradients"):
        tp.Program.from_traces(p.forward, tp.load_program(str(NANOGPT)).backward)


def test_a_pipeline_reports_statistics_by_pass_and_trace_and_provenance():
    p = tp.load_program(str(NANOGPT))
    before = str(p.backward)
    r = tp.run_pipeline(p, "ddp(world_size=2),sort-waits,dce")
    assert r.pipeline == "ddp(world_size=2,bucket_mb=25),sort-waits,dce"
    # the input is left as it was
    assert str(p.backward) == before
    bwd = str(r.program.backward)
    assert "all_reduce" in bwd and "wait" in bwd
    assert str(r.trace) == bwd
    ddp = {s["name"]: s for s in r.stats if s["pass"] == "ddp"}
    assert ddp["ddp.gradients"]["value"] == 28 and ddp["ddp.gradients"]["trace"] is None
    assert r.stat("ddp.buckets") == ddp["ddp.buckets"]["value"] >= 1
    # a trace-level pass reports per trace
    assert {s["trace"] for s in r.stats if s["pass"] in ("sort-waits", "dce")} <= {"forward", "backward"}
    assert [(t["pass"], t["trace"]) for t in r.timings][:2] == [("ddp(world_size=2)", None), ("sort-waits", "forward")]
    assert r.provenance["backward"][-1]["pass"] in ("ddp(world_size=2,bucket_mb=25)", "sort-waits", "dce")
    assert "ddp(world_size=2,bucket_mb=25)" in [x["pass"] for x in r.provenance["backward"]]
    assert r.provenance["backward"] == r.program.backward.provenance
    # a second pipeline on the result builds on it
    r2 = tp.run_pipeline(r.program, "backward(dce)")
    assert r2.program.backward.provenance[: len(r.provenance["backward"])] == r.provenance["backward"]


def test_a_pipeline_runs_on_a_lone_trace():
    r = tp.run_pipeline(tp.parse_trace(NEG + ""), "dce,cse")
    assert r.program is None and list(r.provenance) == ["backward"]
    assert all(s["trace"] == "backward" for s in r.stats)


def test_a_wrong_pipeline_is_a_pipeline_error_before_any_pass_runs():
    p = tp.load_program(str(NANOGPT))
    with pytest.raises(tp.PipelineError) as e:
        tp.run_pipeline(p, "dce,no-such-pass")
    assert "no-such-pass" in str(e.value) and "sort-waits" in str(e.value)
    with pytest.raises(tp.PipelineError, match="valid options: world_size"):
        tp.run_pipeline(p, "ddp(world_size=2,bucket=3)")
    with pytest.raises(tp.PipelineError, match="world_size"):
        tp.run_pipeline(p, "ddp(world_size=two)")
    with pytest.raises(tp.PipelineError, match="bad pipeline"):
        tp.run_pipeline(p, "ddp(world_size=2")
    with pytest.raises(TypeError):
        tp.run_pipeline("not a program", "dce")


def test_help_lists_every_pass_and_its_options():
    listed = {p["name"]: p for p in tp.passes()}
    for name in ("ddp", "sort-waits", "no-sync", "accumulate-grads", "dce", "cse"):
        assert name in listed and listed[name]["help"]
        assert name in tp.passes_help()
    ddp = {o["name"]: o for o in listed["ddp"]["options"]}
    assert ddp["world_size"]["required"] and ddp["bucket_mb"]["default"] == "25"
    assert listed["ddp"]["level"] == "program" and listed["dce"]["level"] == "trace"
    assert "world_size" in tp.passes_help()


def test_a_registered_python_pass_runs_in_pipelines():
    seen = []

    def neg_to_abs(trace, options):
        seen.append((trace.kind, options["times"]))
        if "prims.neg" not in trace.ops:
            return None, {"neg-to-abs.rewritten": 0}
        return tp.parse_trace(str(trace).replace("prims.neg", "prims.abs")), {"neg-to-abs.rewritten": 1}

    tp.register_pass("neg-to-abs", neg_to_abs, help="replaces neg by abs", options={"times": 1})
    assert "neg-to-abs" in tp.passes_help()
    with pytest.raises(tp.PipelineError, match="already registered"):
        tp.register_pass("neg-to-abs", neg_to_abs)
    r = tp.run_pipeline(tp.parse_trace(NEG), "neg-to-abs(times=3),dce")
    assert seen == [("computation", 3)]
    assert r.trace.ops == ["prims.abs", "prims.mul"]
    assert r.stat("neg-to-abs.rewritten") == 1
    assert r.provenance["backward"][0]["pass"] == "neg-to-abs(times=3)"
    with pytest.raises(tp.PipelineError, match="times"):
        tp.run_pipeline(tp.parse_trace(NEG), "neg-to-abs(times=x)")


def test_a_failing_python_pass_is_a_pass_error_and_invalid_ir_a_verify_error():
    def boom(trace, options):
        raise ValueError("no thanks")

    def breaks(trace, options):
        return tp.parse_trace(str(trace).replace('b: "cpu f32[4]"', 'b: "cpu f32[9]"'))

    def wrong(trace, options):
        return 42

    tp.register_pass("boom-pass", boom)
    tp.register_pass("breaks-ir", breaks)
    tp.register_pass("returns-int", wrong)
    with pytest.raises(tp.PassError) as e:
        tp.run_pipeline(tp.parse_trace(NEG), "boom-pass")
    assert e.value.pass_name == "boom-pass" and "no thanks" in e.value.message
    with pytest.raises(tp.VerifyError) as e:
        tp.run_pipeline(tp.parse_trace(NEG), "breaks-ir")
    assert e.value.pass_name == "breaks-ir" and "f32[9]" in e.value.violations[0]["message"]
    # without verification after each pass the end of the pipeline is still verified
    with pytest.raises(tp.VerifyError) as e:
        tp.run_pipeline(tp.parse_trace(NEG), "breaks-ir", verify=False)
    assert "verification after each pass was off" in str(e.value)
    assert "f32[9]" in e.value.violations[0]["message"]
    with pytest.raises(tp.PassError, match="not a tracepass.Trace"):
        tp.run_pipeline(tp.parse_trace(NEG), "returns-int")


def test_a_pass_refusing_its_input_writes_a_reproducer(tmp_path):
    # dce anchored to the forward of a lone trace: a pipeline error, no reproducer
    with pytest.raises(tp.PipelineError, match="no forward"):
        tp.run_pipeline(tp.parse_trace(NEG), "forward(dce)", reproducer_dir=str(tmp_path))

    def breaks(trace, options):
        return tp.parse_trace(str(trace).replace('b: "cpu f32[4]"', 'b: "cpu f32[9]"'))

    tp.register_pass("breaks-ir-repro", breaks)
    with pytest.raises(tp.VerifyError):
        tp.run_pipeline(tp.parse_trace(NEG), "breaks-ir-repro", reproducer_dir=str(tmp_path))
    assert list(tmp_path.glob("tracepass-reproducer-*.json"))


def test_simulate_predicts_a_step_and_its_buckets():
    p = tp.load_program(str(NANOGPT))
    r = tp.simulate(p, 8, device="h100", link="nvlink", passes="ddp(world_size=8,bucket_mb=0),sort-waits")
    assert r["step_s"] > 0 and r["compute_s"] > 0 and r["ops"] > 0
    # bucket_mb=0: one all-reduce per gradient
    assert len(r["buckets"]) == 28
    assert 0.0 <= r["overlap_pct"] <= 100.0
    one = tp.simulate(p, 8, passes="ddp(world_size=8,bucket_mb=1000),sort-waits")
    assert len(one["buckets"]) == 1
    with pytest.raises(tp.SimulateError, match="unknown"):
        tp.simulate(p, 8, device="tpu")
    with pytest.raises(tp.PipelineError, match="world"):
        tp.simulate(p, 4, passes="ddp(world_size=8)")


def test_every_error_is_a_tracepass_error_exported_from_the_package():
    from tracepass import _native

    native = {n for n, v in vars(_native).items() if isinstance(v, type) and issubclass(v, BaseException)}
    # every exception the Rust side raises, and tracepass.thunder's, is in the hierarchy and
    # reachable from `tracepass` (without importing Thunder)
    assert native | {"ThunderDDPError"} == set(tp.errors.__all__), sorted(native ^ set(tp.errors.__all__))
    assert set(tp.errors.__all__) <= set(tp.__all__)
    for name in tp.errors.__all__:
        cls = getattr(tp, name)
        assert cls is getattr(tp.errors, name)
        assert issubclass(cls, tp.TracepassError) and issubclass(cls, Exception), name


def test_a_plan_error_keeps_kind_message_and_line():
    with pytest.raises(tp.PlanError) as e:
        tp._native.plan_ddp(NEG, [], 1, 25.0)
    assert (e.value.kind, e.value.line, e.value.file) == ("options", None, None)
    assert "world size 1" in e.value.message and str(e.value) == e.value.message
    with pytest.raises(tp.PlanError) as e:
        tp._native.plan_ddp(NEG.replace("prims.mul", "user.frobnicate"), [], 2, 25.0)
    assert (e.value.kind, e.value.line) == ("parse", 4), str(e.value)
    assert "frobnicate" in e.value.message
    with pytest.raises(tp.PlanError) as e:
        tp._native.plan_ddp(NEG, [("w", 3, True, None)], 2, 25.0)
    assert e.value.kind == "gradients", str(e.value)
    # tracepass.thunder's error carries the same attributes
    err = tp.ThunderDDPError("no plan", "parse", line=7)
    assert (err.message, err.kind, err.line, err.file) == ("no plan", "parse", 7, None)


def test_the_type_stubs_cover_the_native_module():
    import ast

    from tracepass import _native

    stub = Path(tp.__file__).with_name("_native.pyi")
    tree = ast.parse(stub.read_text())
    declared = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    declared |= {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    public = {n for n in dir(_native) if not n.startswith("_")}
    assert public <= declared, sorted(public - declared)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    for cls in ("Trace", "Program", "PipelineResult", "Statement"):
        stubbed = {m.name for m in classes[cls].body if isinstance(m, ast.FunctionDef)}
        real = {m for m in dir(getattr(_native, cls)) if not m.startswith("_")}
        assert real <= stubbed, (cls, sorted(real - stubbed))


def test_the_package_reaches_every_name_of_tracepass_thunder_lazily():
    import ast

    source = Path(tp.__file__).with_name("thunder.py").read_text()
    exported = next(
        ast.literal_eval(n.value)
        for n in ast.parse(source).body
        if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in n.targets)
    )
    # the exception is in tracepass.errors, reachable without Thunder
    assert set(exported) == set(tp._THUNDER_NAMES) | {"ThunderDDPError"}
    assert set(exported) <= set(dir(tp))
