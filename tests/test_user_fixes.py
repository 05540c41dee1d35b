"""Issue 16: what a new user tripped over -- attribution, shapes, honest headlines, dump
directories, calibration under load and small input checks.

Every expected figure is computed here from the shapes in the test's HLO text.
"""

from __future__ import annotations

import io
import json
import os
from contextlib import redirect_stdout

import pytest

import jaxmove
from jaxmove.cli import main
from jaxmove.report.annotate import annotate
from jaxmove.report.attribution import aggregate, attribute, display_path, rollup_path

# A weight convert and a matrix-vector dot that XLA re-created without metadata (as
# XLA:CPU's gemv rewriter does), feeding a cache-update fusion that kept its line; and two
# layers of the same block (layers_0, layers_1) for the roll-up.
SRC = "/home/u/proj/.venv/lib/python3.11/site-packages/flax/nnx/nn/linear.py"
HLO = f"""HloModule attribution, entry_computation_layout={{(bf16[64,64]{{1,0}}, f32[64,1]{{1,0}}, f32[64]{{0}})->(f32[1,64]{{1,0}}, f32[64]{{0}}, f32[64]{{0}})}}

%fused_convert (p: bf16[64,64]) -> f32[64,64] {{
  %p = bf16[64,64]{{1,0}} parameter(0)
  ROOT %c = f32[64,64]{{1,0}} convert(%p)
}}

%fused_update (a: f32[1,64]) -> f32[1,64] {{
  %a = f32[1,64]{{1,0}} parameter(0)
  ROOT %t = f32[1,64]{{1,0}} tanh(%a), metadata={{op_name="jit(f)/layers_0/attn/tanh" source_file="{SRC}" source_line=1342}}
}}

ENTRY %main (w: bf16[64,64], x: f32[64,1], v: f32[64]) -> (f32[1,64], f32[64], f32[64]) {{
  %w = bf16[64,64]{{1,0}} parameter(0)
  %x = f32[64,1]{{1,0}} parameter(1)
  %v = f32[64]{{0}} parameter(2)
  %convert_fusion = f32[64,64]{{1,0}} fusion(%w), kind=kLoop, calls=%fused_convert
  %dot.1 = f32[1,64]{{1,0}} dot(%x, %convert_fusion), lhs_contracting_dims={{0}}, rhs_contracting_dims={{0}}
  %update = f32[1,64]{{1,0}} fusion(%dot.1), kind=kLoop, calls=%fused_update
  %n0 = f32[64]{{0}} negate(%v), metadata={{op_name="jit(f)/layers_0/mlp/neg" source_file="/x/m.py" source_line=7}}
  %n1 = f32[64]{{0}} negate(%n0), metadata={{op_name="jit(f)/layers_1/mlp/neg" source_file="/x/m.py" source_line=7}}
  %orphan = f32[64]{{0}} exponential(%v)
  ROOT %out = (f32[1,64]{{1,0}}, f32[64]{{0}}, f32[64]{{0}}) tuple(%update, %n1, %orphan)
}}
"""


@pytest.fixture(scope="module")
def hlo_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("attr") / "attribution.hlo"
    path.write_text(HLO)
    return path


@pytest.fixture(scope="module")
def report(hlo_path):
    return jaxmove.analyze(str(hlo_path))


def _cli_json(*argv) -> dict:
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(list(argv)) == 0
    return json.loads(buf.getvalue())


# ---- 2. attribution -------------------------------------------------------------------

def test_source_lines_are_inferred_through_metadata_less_neighbours(report):
    by = report.module.entry.by_name
    # the dot's only user is the fusion that kept line 1342; the convert reaches it through
    # the dot, which has no line either (two hops)
    for name in ("dot.1", "convert_fusion"):
        att = attribute(report.module, by[name])
        assert (att.source.file, att.source.line) == (SRC, 1342), name
        assert att.source_inferred and att.source_inferred_from == "update", name
        assert att.module_path == "layers_0/attn" and att.module_inferred, name
    own = attribute(report.module, by["update"])
    assert not own.source_inferred and own.source_inferred_from == ""
    # a value used only by the ROOT tuple and computed from a parameter has no neighbour with
    # a line: it stays without one (never a made-up place)
    assert attribute(report.module, by["orphan"]).source is None


def test_json_marks_inferred_sources(report):
    rows = {r["name"]: r for r in report.to_json()["instructions"]}
    assert rows["dot.1"]["source"] == f"{SRC}:1342" and rows["dot.1"]["source_inferred"] is True
    assert rows["dot.1"]["source_inferred_from"] == "update"
    assert rows["update"]["source_inferred"] is False and rows["update"]["source_inferred_from"] is None
    assert rows["orphan"]["source"] is None


def test_by_source_groups_inferred_rows_with_their_line(report):
    groups = {g.key: g for g in aggregate(report, "source")}
    g = groups[f"{SRC}:1342"]
    # convert_fusion: read bf16[64,64] 8192 B, write f32[64,64] 16384 B; dot.1: read
    # f32[64,1] 256 + f32[64,64] 16384, write f32[1,64] 256; update: read 256, write 256
    assert g.instructions == 3 and g.inferred == 2
    assert g.total.hbm_read_bytes == 8192 + 256 + 16384 + 256
    assert g.total.hbm_write_bytes == 16384 + 256 + 256
    assert g.label == "flax/nnx/nn/linear.py:1342"


def test_display_paths_are_relative_and_whole(tmp_path):
    assert display_path(SRC) == "flax/nnx/nn/linear.py"
    assert display_path("/usr/lib/python3/dist-packages/jax/_src/lax/lax.py") == "jax/_src/lax/lax.py"
    mine = str(tmp_path / "pkg" / "model.py")
    assert display_path(mine, cwd=str(tmp_path)) == os.path.join("pkg", "model.py")
    assert display_path("/elsewhere/x.py", cwd=str(tmp_path)) == "/elsewhere/x.py"
    assert display_path("<embedded module>") == "<embedded module>"


def test_table_shows_relative_paths_uncut(hlo_path, capsys):
    assert main(["analyze", str(hlo_path), "--by", "source"]) == 0
    out = capsys.readouterr().out
    assert "flax/nnx/nn/linear.py:1342" in out and "site-packages" not in out


def test_by_module_rolls_up_repeated_layers(report, hlo_path):
    assert rollup_path("layers_3/attn") == "layers_*/attn"
    assert rollup_path("h/11/mlp") == "h/*/mlp"
    assert rollup_path("fc1/out") == "fc1/out"
    groups = {g.key: g for g in aggregate(report, "module", rollup=True)}
    # n0 and n1: each negate reads and writes f32[64] = 256 B
    assert groups["layers_*/mlp"].instructions == 2 and groups["layers_*/mlp"].merged == 2
    assert groups["layers_*/mlp"].total.hbm_bytes == 4 * 256
    plain = {g.key for g in aggregate(report, "module")}
    assert {"layers_0/mlp", "layers_1/mlp"} <= plain
    d = _cli_json("analyze", str(hlo_path), "--by", "module", "--rollup", "--json")
    rolled = {g["key"]: g for g in d["by_module_rollup"]}
    assert rolled["layers_*/mlp"]["merged_paths"] == 2
    assert {g["key"] for g in d["by_module"]} == plain


@pytest.fixture(scope="module")
def tiny_decode():
    return jaxmove.analyze("gpt-tiny-decode")


def test_a_zoo_decode_has_a_source_for_every_instruction(tiny_decode):
    rows = tiny_decode.to_json()["instructions"]
    inferred = [r for r in rows if r["source_inferred"]]
    assert inferred, "XLA:CPU drops the metadata of re-created dots: some must be inferred"
    assert all(r["source"] for r in rows)
    assert "(no source)" not in {g.key for g in aggregate(tiny_decode, "source")}


# ---- 3. shapes and dtypes -------------------------------------------------------------

def test_shapes_in_json_table_and_annotation(report, hlo_path, capsys):
    rows = {r["name"]: r for r in report.to_json()["instructions"]}
    assert rows["dot.1"]["shape"] == "f32[1,64]"
    assert rows["dot.1"]["operand_shapes"] == ["f32[64,1]", "f32[64,64]"]
    assert rows["convert_fusion"]["operand_shapes"] == ["bf16[64,64]"]
    assert rows["n1"]["shape"] == "f32[64]"
    assert main(["analyze", str(hlo_path)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    k = next(i for i, ln in enumerate(lines) if "convert_fusion" in ln)
    assert "f32[64,64]" in lines[k] and "← bf16[64,64]" in lines[k + 1]   # operands: next line
    text = annotate(report, HLO)
    line = next(ln for ln in text.splitlines() if ln.lstrip().startswith("%dot.1 ="))
    assert 'shape="f32[1,64]"' in line and 'operand_shapes="f32[64,1]; f32[64,64]"' in line
    assert 'src_inferred_from="update"' in line


# ---- 4. honest headlines --------------------------------------------------------------

UNKNOWN = """HloModule unknown_op, entry_computation_layout={(f32[1024,1024]{1,0})->f32[1024,1024]{1,0}}

ENTRY %main (x: f32[1024,1024]) -> f32[1024,1024] {
  %x = f32[1024,1024]{1,0} parameter(0)
  %a = f32[1024,1024]{1,0} negate(%x)
  %c = f32[1024,1024]{1,0} custom-call(%a), custom_call_target="my_allreduce_replacement"
  ROOT %d = f32[1024,1024]{1,0} multiply(%c, %x)
}
"""


@pytest.fixture(scope="module")
def unknown_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("unk") / "unknown.hlo"
    path.write_text(UNKNOWN)
    return path


def test_headline_says_incomplete_and_time_is_at_least(unknown_path, capsys):
    assert main(["analyze", str(unknown_path), "--hardware", "h100-sxm"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("incomplete: 1 instruction unmodeled")
    est = next(ln for ln in lines if ln.startswith("Estimated time on h100-sxm"))
    assert "at least" in est
    d = _cli_json("analyze", str(unknown_path), "--hardware", "h100-sxm", "--json")
    assert d["complete"] is False and d["unmodeled_count"] == 1
    assert d["time"]["est_time_is_lower_bound"] is True
    annotated = annotate(jaxmove.analyze(str(unknown_path)), UNKNOWN)
    assert annotated.startswith("// incomplete: 1 instruction unmodeled")


def test_complete_programs_say_nothing(hlo_path, capsys):
    assert main(["analyze", str(hlo_path), "--hardware", "h100-sxm"]) == 0
    out = capsys.readouterr().out
    assert "incomplete" not in out and "at least" not in out
    d = _cli_json("analyze", str(hlo_path), "--json")
    assert d["complete"] is True and d["unmodeled_count"] == 0


# ---- 5. calibrate under load ----------------------------------------------------------

def _fake_probes(monkeypatch, per_kernel_s):
    """Replace the timing probes by fixed repeats (seconds / rates as a busy machine gave
    them); everything else (median, spread, limits, saving, printing) runs as it is."""
    import importlib
    cal = importlib.import_module("jaxmove.hardware.calibrate")   # the module, not the function

    monkeypatch.setattr(cal, "_measure_stream", lambda plan, dev: (
        [100e9, 101e9, 99e9], {"stream_array_bytes": 1 << 20, "stream_calls": 9}))
    monkeypatch.setattr(cal, "_measure_matmul", lambda plan, dev, dt, pr: (
        [1.0e11, 1.02e11, 0.99e11], {"n": 512, "calls": 6}))
    monkeypatch.setattr(cal, "_measure_kernel_overhead", lambda plan, dev: (
        list(per_kernel_s), [12e-6, 12.5e-6, 11.8e-6],
        {"kernel_chain_kernels": 65, "kernel_chain_median_s": 1e-4, "kernel_chain_1_kernels": 2,
         "kernel_chain_1_median_s": 13e-6, "kernel_overhead_estimator": "median difference"}))
    monkeypatch.setattr(cal, "_measure_first_touch", lambda plan, dev: None)


def test_calibrate_keeps_the_median_and_refuses_an_unstable_spread(monkeypatch, tmp_path, capsys):
    from jaxmove.hardware import load_spec

    # the figures: idle repeats 0.34 and 0.42 us, one under load 0.0065 us
    _fake_probes(monkeypatch, [0.34e-6, 0.0065e-6, 0.42e-6])
    out = tmp_path / "local.toml"
    assert main(["calibrate", "--quick", "-o", str(out)]) == 1
    captured = capsys.readouterr()
    assert not out.exists()
    assert "kernel_launch_overhead_s: spread" in captured.err and "--force" in captured.err
    want_spread = (0.42e-6 - 0.0065e-6) / 0.34e-6        # (max - min) / median = 122%
    assert f"spread {want_spread:.0%}" in captured.out and "UNSTABLE" in captured.out

    assert main(["calibrate", "--quick", "-o", str(out), "--force"]) == 0
    printed = capsys.readouterr().out
    spec = load_spec(str(out))
    assert spec.kernel_launch_overhead_s == pytest.approx(0.34e-6)       # the median, not a mean
    assert spec.hbm_bytes_per_s == pytest.approx(100e9)
    assert spec.dispatch_overhead_s == pytest.approx(12e-6)
    assert spec.calibration["kernel_launch_overhead_s_spread"] == pytest.approx(want_spread, abs=1e-4)
    assert spec.calibration["unstable"] == "kernel_launch_overhead_s"
    # every figure the file holds was printed (dispatch and first-touch included)
    shown = {ln.split()[0] for ln in printed.splitlines() if ln.startswith("  ")}
    assert set(spec.numeric_fields()) <= shown


def test_calibrate_saves_agreeing_repeats_without_force(monkeypatch, tmp_path, capsys):
    _fake_probes(monkeypatch, [0.34e-6, 0.36e-6, 0.40e-6])   # spread 18% < 50%
    out = tmp_path / "local.toml"
    assert main(["calibrate", "--quick", "-o", str(out)]) == 0
    assert out.is_file() and "UNSTABLE" not in capsys.readouterr().out


# ---- 6. XLA dump directories ----------------------------------------------------------

PLAIN = """HloModule {name}, entry_computation_layout={{(f32[{n}]{{0}})->f32[{n}]{{0}}}}

ENTRY %main (x: f32[{n}]) -> f32[{n}] {{
  %x = f32[{n}]{{0}} parameter(0)
  ROOT %y = f32[{n}]{{0}} negate(%x)
}}
"""   # nothing in the text says which compiler wrote it


def _dump_dir(root, files: dict[str, str]):
    root.mkdir()
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def test_dump_directory_one_module_backend_from_file_names(tmp_path):
    # the names XLA:CPU, XLA:GPU and XLA:TPU give their optimized modules (capture/dumps.py)
    cases = {
        "cpu": {"module_0004.jit_f.cpu_after_optimizations.txt": PLAIN.format(name="jit_f", n=256),
                "module_0004.jit_f.before_optimizations.txt": PLAIN.format(name="jit_f", n=256),
                "module_0004.jit_f.cpu_after_optimizations-buffer-assignment.txt": "not HLO"},
        "gpu": {"module_0001.jit_f.sm_9.0a_gpu_after_optimizations.txt": PLAIN.format(name="jit_f", n=256),
                "module_0001.jit_f.sm_9.0a_gpu_after_optimizations-memory-usage-report.txt": "not HLO"},
        "tpu": {"module_0000.jit_f.cl_1.after_optimizations.txt": PLAIN.format(name="jit_f", n=256),
                "module_0000.jit_f.cl_1.after_optimizations_after_buffer_assignment.txt": "not this",
                "module_0000.jit_f.cl_1.tpu_comp_env.txt": "env"},
    }
    for backend, files in cases.items():
        d = _cli_json("analyze", str(_dump_dir(tmp_path / backend, files)), "--json")
        assert d["program"]["backend"] == backend
        assert d["program"]["source"].endswith("after_optimizations.txt")
        (row,) = d["instructions"]
        assert row["hbm_read_bytes"] == 256 * 4 and row["hbm_write_bytes"] == 256 * 4
        # the file alone: the backend from its name too
        (name,) = [n for n in files if n.endswith(".after_optimizations.txt") or
                   n.endswith("_after_optimizations.txt")]
        assert jaxmove.analyze(str(tmp_path / backend / name)).program.backend == backend


def test_dump_directory_with_several_modules_lists_them(tmp_path, capsys):
    root = _dump_dir(tmp_path / "many", {
        "module_0000.jit_convert_element_type.cpu_after_optimizations.txt":
            PLAIN.format(name="jit_convert_element_type", n=8),
        "module_0004.jit_step.cpu_after_optimizations.txt": PLAIN.format(name="jit_step", n=1024),
        "module_0007.jit_step.cpu_after_optimizations.txt": PLAIN.format(name="jit_step", n=64),
    })
    assert main(["analyze", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--module" in err
    assert "module_0000.jit_convert_element_type" in err and "module_0007.jit_step" in err
    assert main(["analyze", str(root), "--module", "jit_step"]) == 2      # compiled twice
    assert "by its number" in capsys.readouterr().err
    for choice, n in (("4", 1024), ("module_0007.jit_step", 64), ("jit_convert_element_type", 8)):
        d = _cli_json("analyze", str(root), "--module", choice, "--json")
        assert d["instructions"][0]["hbm_read_bytes"] == n * 4, choice
    assert main(["analyze", str(root), "--module", "nope"]) == 2
    assert "no such module" in capsys.readouterr().err
    assert main(["analyze", str(root), "--module", ""]) == 2
    assert "needs a module name or number" in capsys.readouterr().err
    # a module name with a dot (a function named step.v2): listed and chosen by its whole name,
    # on every backend's file name form (it was cut at the dot)
    dotted = _dump_dir(tmp_path / "dotted", {
        "module_0004.jit_step.v2.cpu_after_optimizations.txt": PLAIN.format(name="jit_step.v2", n=32),
        "module_0005.jit_step.cpu_after_optimizations.txt": PLAIN.format(name="jit_step", n=16),
        "module_0006.jit_a.b.sm_9.0a_gpu_after_optimizations.txt": PLAIN.format(name="jit_a.b", n=8),
        "module_0007.jit_c.d.cl_12.after_optimizations.txt": PLAIN.format(name="jit_c.d", n=4)})
    for choice, n in (("jit_step.v2", 32), ("jit_step", 16), ("module_0004.jit_step.v2", 32),
                      ("jit_a.b", 8), ("jit_c.d", 4)):
        d = _cli_json("analyze", str(dotted), "--module", choice, "--json")
        assert d["instructions"][0]["hbm_read_bytes"] == n * 4, choice
    empty = _dump_dir(tmp_path / "empty", {"module_0000.jit_f.before_optimizations.txt": "x"})
    assert main(["analyze", str(empty)]) == 2
    assert "no *after_optimizations.txt" in capsys.readouterr().err


def test_a_real_xla_cpu_dump(tmp_path):
    """XLA:CPU's own dump of a jitted function (and of jax's helper programs)."""
    import subprocess
    import sys

    dump = tmp_path / "dump"
    code = ("import jax, jax.numpy as jnp\n"
            "f = jax.jit(lambda x: jnp.tanh(x) * 2.0)\n"
            "f(jnp.ones((128, 64), jnp.float32)).block_until_ready()\n")
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_dump_to={dump} --xla_dump_hlo_as_text")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300, capture_output=True)
    from jaxmove.capture.dumps import list_modules
    mods = list_modules(dump)
    assert all(m.backend == "cpu" for m in mods)
    (mine,) = [m for m in mods if m.name == "jit__lambda"]
    report = jaxmove.analyze(str(dump), module=mine.label)
    assert report.program.backend == "cpu"
    # tanh(x) * 2 over f32[128,64]: read 32 KiB, write 32 KiB, at the least (one fused kernel)
    assert report.totals.hbm_read_bytes >= 128 * 64 * 4 and report.totals.hbm_write_bytes >= 128 * 64 * 4


# ---- 8. small items -------------------------------------------------------------------

def test_arguments_larger_than_the_device_memory_are_said_first(tmp_path, capsys):
    # f32[2^22, 2^22] = 2^44 x 4 B = 64 TiB of weights (abstract: nothing is allocated)
    (tmp_path / "huge.py").write_text(
        "import jax, jax.numpy as jnp\n"
        "from jaxmove.workload import Workload\n"
        "def make():\n"
        "    S = jax.ShapeDtypeStruct\n"
        "    return Workload('huge', lambda w, x: x @ w, (S((2**22, 2**22), jnp.float32),\n"
        "                    S((1, 2**22), jnp.float32)), roles=('weights', 'activations'))\n")
    target = f"{tmp_path / 'huge.py'}:make"
    assert main(["analyze", target, "--hardware", "h100-sxm"]) == 2   # the rule of every target (#29.1)
    lines = capsys.readouterr().out.splitlines()
    first = " ".join(lines[:3])   # (the headline, wrapped to the terminal's width)
    # the figure is XLA's memory_analysis where it needs more than the arguments (+ 32 MiB here)
    assert lines[0].startswith("does not fit:") and "64.00 TiB" in first and "h100-sxm" in first
    from jaxmove.hardware import load_spec
    cap = load_spec("h100-sxm").hbm_capacity_bytes
    ratio = (2**44 * 4 + 2**22 * 4) / cap   # arguments: the weights (2^44 f32) and x (2^22 f32)
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["analyze", target, "--hardware", "h100-sxm", "--json"]) == 2
    d = json.loads(buf.getvalue())
    assert any(n.startswith("does not fit:") and f"({ratio:.3g}x;" in n for n in d["notes"])
    # no hardware spec, or a program that fits: nothing said
    d = _cli_json("analyze", target, "--json")
    assert not any("does not fit" in n for n in d["notes"])


def test_a_failed_import_inside_the_target_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "imperr.py").write_text("import os\nimport no_such_package_xyz\n\ndef f():\n    pass\n")
    (tmp_path / "imperr_late.py").write_text("def f():\n    import no_such_package_xyz\n")
    for target, line in (("imperr:f", "imperr.py:2"), ("imperr.py:f", "imperr.py:2"),
                         ("imperr_late:f", "imperr_late.py:2")):
        assert main(["analyze", target]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert f"an import failed at {line}" in err and "no_such_package_xyz" in err, err
        assert "not installed" in err


def test_unlabeled_cache_has_the_role_its_dump_gives(tmp_path):
    """One rule for roles: the in-place cache update of a Workload without roles is kv_cache,
    as in the dump of the same program (which has only the names)."""
    import jax
    import jax.numpy as jnp

    from jaxmove.workload import Workload

    def step(params, cache, x, pos):
        k = x @ params["wk"]
        cache = {"k": jax.lax.dynamic_update_slice(cache["k"], k[:, None, :], (0, pos, 0))}
        return cache["k"].sum(axis=1) * k, cache

    S = jax.ShapeDtypeStruct
    wl = Workload("cache_step", step, ({"wk": S((64, 64), jnp.float32)},
                                       {"k": S((2, 128, 64), jnp.float32)},
                                       S((2, 64), jnp.float32), S((), jnp.int32)),
                  roles=None, donate_argnums=(1,))
    program = jaxmove.resolve_program(wl)
    assert {p.path: p.role for p in program.parameters} == {
        "params/wk": "weights", "cache/k": "kv_cache", "x": "activations", "pos": "activations"}
    dump = tmp_path / "cache_step.hlo"
    dump.write_text(program.hlo_text)
    captured = jaxmove.analyze(program).to_json()["by_role"]
    dumped = jaxmove.analyze(str(dump)).to_json()["by_role"]
    for role in ("weights", "kv_cache"):
        assert captured[role] == dumped[role], role
    # the cache: read where the sum reads it, f32[2,128,64] = 65536 B; written: the new row
    # f32[2,1,64] = 512 B in place
    assert captured["kv_cache"] == {"read_bytes": 2 * 128 * 64 * 4, "write_bytes": 2 * 64 * 4}


FP8_DOT = """HloModule fp8dot
ENTRY %main (a: f8e4m3fn[128,128], b: f8e4m3fn[128,128]) -> f32[128,128] {
  %a = f8e4m3fn[128,128]{1,0} parameter(0)
  %b = f8e4m3fn[128,128]{1,0} parameter(1)
  ROOT %d = f32[128,128]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


def test_a_program_timed_in_part_says_its_bytes_are_complete(tmp_path, capsys):
    # tpu-v5e's spec has no fp8 peak: the dot's time is incomplete, its bytes are not (the
    # headline said "totals and time are lower bounds")
    path = tmp_path / "fp8.hlo"
    path.write_text(FP8_DOT)
    assert main(["analyze", str(path), "--hardware", "tpu-v5e"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == ("incomplete: 1 instruction with incomplete time (the estimated time is a lower "
                     "bound; the byte totals are complete; listed below)")
    d = _cli_json("analyze", str(path), "--hardware", "tpu-v5e", "--json")
    assert d["totals"]["hbm_read_bytes"] == 2 * 128 * 128 and d["unmodeled_count"] == 0
