"""Adversarial inputs (issue 29): each ends in a clean, positioned error or in numbers that are
right, never in an internal error, a blown-up memory or a silently wrong size.

Expected values are XLA's rules written out by hand: its lexer reads integers as
``[-]?[0-9]+`` (xla/hlo/parser/hlo_lexer.cc), array sizes are int64, tile dimensions are
positive (``Tile`` in xla/layout.h), device ids are non-negative.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jaxmove.hlo import HloParseError, parse_module
from jaxmove.hlo.errors import HloFileError
from jaxmove.hlo.parser import MAX_NESTED_OPERAND_DEPTH, MAX_TUPLE_DEPTH, read_hlo_text
from jaxmove.hlo.replica_groups import MAX_DEVICES, ReplicaGroupsError, parse_replica_groups


def _entry(body: str, header: str = "") -> str:
    return f"HloModule m{header}\n\nENTRY e {{\n{body}\n}}\n"


def _error(text: str) -> HloParseError:
    with pytest.raises(HloParseError) as e:
        parse_module(text, "adv.hlo")
    assert e.value.filename == "adv.hlo" and e.value.line >= 1 and e.value.column >= 1
    return e.value


# ---- digits: ASCII only, as XLA's lexer -------------------------------------------------

@pytest.mark.parametrize("body, what", [
    ("  ROOT p = f32[\u00b2] parameter(0)", "dimension size"),          # superscript two
    ("  ROOT p = f32[\u0663] parameter(0)", "dimension size"),          # Arabic-Indic three
    ("  ROOT p = f32[2] parameter(\u00b9)", "parameter number"),
    ("  ROOT p = f32[2] parameter(\u0661)", "parameter number"),
    ("  p = (f32[2]) parameter(0)\n  ROOT g = f32[2] get-tuple-element(p), index=\u00b9",
     "index=<integer>"),
    ("  p = (f32[2]) parameter(0)\n  ROOT g = get-tuple-element(p), index=\u00b9", "not an element"),
    ("  ROOT p = f32[4,4]{1,0:T(\u00b2,128)} parameter(0)", "integers in layout"),
    ("  ROOT p = f32[4,4]{\u0661,0} parameter(0)", "integers in layout"),
])
def test_non_ascii_digits_are_parse_errors(body, what):
    # int('²') raises ValueError (was an internal error, exit 1); int('٣') == 3 (was accepted)
    assert what in _error(_entry(body)).expected


def test_non_ascii_trip_count_is_a_parse_error():
    text = """HloModule m
cond {
  t = (s32[]) parameter(0)
  ROOT c = pred[] constant(true)
}
body {
  t = (s32[]) parameter(0)
  g = s32[] get-tuple-element(t), index=0
  ROOT r = (s32[]) tuple(g)
}
ENTRY e {
  z = s32[] constant(0)
  i = (s32[]) tuple(z)
  ROOT w = (s32[]) while(i), condition=cond, body=body, backend_config={"known_trip_count":{"n":"\u00b2"}}
}
"""
    e = _error(text)
    assert "known_trip_count" in e.expected and e.line == 14


# ---- layouts: tiles, element sizes -------------------------------------------------------

@pytest.mark.parametrize("layout, what", [
    ("{1,0:T(-8,128)}", "positive tile dimensions"),
    ("{1,0:T(0,128)}", "positive tile dimensions"),
    ("{1,0:T(8,128)E(-4)}", "non-negative element size"),
    ("{1,0:S(-1)}", "non-negative memory space"),
])
def test_bad_tile_and_element_sizes_are_refused(layout, what):
    assert what in _error(_entry(f"  ROOT p = f32[4,4]{layout} parameter(0)")).expected


def test_tile_padding_past_int64_is_refused():
    # f32[4,4] under T(2^63-1, 128) pads to (2^63-1) x 128 elements x 4 bytes: 4.7e21 bytes,
    # which XLA's int64 sizes cannot hold (was reported as 3.4e38 bytes, complete: true)
    e = _error(_entry("  ROOT p = f32[4,4]{1,0:T(9223372036854775807,128)} parameter(0)"))
    assert "too large" in e.expected and str(((1 << 63) - 1) * 128 * 4) in e.expected


def test_tile_padding_within_int64_is_sized():
    # 8 x 2^40 rows padded, 128 columns, f32: closed form 8 * 2**40 * 128 * 4 bytes
    m = parse_module(_entry("  ROOT p = f32[4,4]{1,0:T(8796093022208,128)} parameter(0)"))
    assert m.entry.root.shape.byte_size == 8796093022208 * 128 * 4
    assert m.entry.root.shape.logical_byte_size == 64


# ---- device counts and ids ----------------------------------------------------------------

@pytest.mark.parametrize("header", [", replica_count=300000000", ", num_partitions=300000000",
                                    f", replica_count={MAX_DEVICES + 1}",
                                    ", replica_count=2048, num_partitions=1024",
                                    ", replica_count=0", ", replica_count=\u00b2"])
def test_header_device_counts_are_capped(header):
    # a 250-byte file with replica_count=300000000 ran out of memory expanding groups
    e = _error(_entry("  ROOT p = f32[2] parameter(0)", header))
    assert e.line == 1 and ("device" in e.expected or "integer" in e.expected)


def test_header_device_counts_at_the_cap_parse():
    m = parse_module(_entry("  ROOT p = f32[2] parameter(0)", ", replica_count=1024, num_partitions=1024"))
    assert m.replica_count * m.num_partitions == MAX_DEVICES


_CP = "  p = f32[2] parameter(0)\n  ROOT c = f32[2] collective-permute(p), {comment}source_target_pairs={pairs}"


@pytest.mark.parametrize("comment", ["", "/*x*/ "])
@pytest.mark.parametrize("pairs, what", [
    ("{{0,1,2}}", "pairs"),
    ("{{0,-1}}", "device id -1"),
    ("[8388608,2]<=[16777216]", "16777216 devices"),
])
def test_source_target_pairs_same_error_on_both_paths(comment, pairs, what):
    # the one-line fast path did not check source_target_pairs (exit 1 in the passes), the
    # general parser (reached with a comment on the line) did: both now give this error
    e = _error(_entry(_CP.format(comment=comment, pairs=pairs)))
    assert what in e.expected and e.line == 5


def test_huge_iota_groups_are_refused_before_allocating():
    # was 24 s and 3.4 GB for 2^24 devices
    with pytest.raises(ReplicaGroupsError, match="more than the"):
        parse_replica_groups(f"[{MAX_DEVICES},2]<=[{2 * MAX_DEVICES}]")
    with pytest.raises(ReplicaGroupsError, match="more than the"):
        parse_replica_groups(f"mesh['a'={MAX_DEVICES},'b'=2]{{'a'}}")


def test_mesh_sub_axis_of_size_zero_is_a_parse_error():
    # 'a':(1)0 was ZeroDivisionError (full % (pre * size)) in replica_groups.py
    body = ("  p = f32[8] parameter(0)\n"
            "  ROOT c = f32[8] all-gather(p), dimensions={0}, replica_groups=mesh['a'=4]{'a':(1)0}")
    assert "at least 1" in _error(_entry(body)).expected
    with pytest.raises(ReplicaGroupsError):
        parse_replica_groups("mesh['a'=4]{'a':(0)2}")


def test_negative_device_ids_are_refused():
    with pytest.raises(ReplicaGroupsError, match="device id -3"):
        parse_replica_groups("{{0,-3}}")
    with pytest.raises(ReplicaGroupsError):
        parse_replica_groups("mesh['a'=2], device_ids=(1,-1) {'a'}")


# ---- nesting --------------------------------------------------------------------------------

def _nested_operands(depth: int) -> str:
    inner = "%p"
    for _ in range(depth):
        inner = f"f32[2] negate({inner})"
    return _entry(f"  p = f32[2] parameter(0)\n  ROOT r = {inner}")


def test_nested_unnamed_operands_are_capped():
    # 500 levels hit RecursionError (exit 1)
    assert "nested as operands deeper than" in _error(_nested_operands(500)).expected
    m = parse_module(_nested_operands(MAX_NESTED_OPERAND_DEPTH))
    assert sum(1 for i in m.entry.instructions if i.opcode == "negate") == MAX_NESTED_OPERAND_DEPTH


def _tuple_chain(n: int) -> str:
    lines = ["  p = f32[2] parameter(0)", "  t0 = tuple(p)"]
    lines += [f"  t{i} = tuple(t{i - 1})" for i in range(1, n)]
    return _entry("\n".join(lines))


def test_chained_tuples_without_shapes_are_capped():
    # 10,000 chained tuples inferred a 10,000-deep tuple shape, then RecursionError
    e = _error(_tuple_chain(10_000))
    assert f"deeper than {MAX_TUPLE_DEPTH}" in e.expected and e.line == 4 + MAX_TUPLE_DEPTH + 1
    m = parse_module(_tuple_chain(MAX_TUPLE_DEPTH))
    assert m.entry.root.shape.tuple_depth == MAX_TUPLE_DEPTH and m.entry.root.shape.byte_size == 8


def test_deep_call_chain_walker_does_not_recurse():
    # the trace builds fresh timing walkers per computation (report/trace.py _SubTimelines);
    # one on the ENTRY of a 10,000-deep call chain hit Python's recursion limit
    from jaxmove.passes.timing import _Walker
    n = 10_000
    out = ["HloModule m\n", "c0 {\n  p = f32[4]{0} parameter(0)\n  ROOT r = f32[4]{0} negate(p)\n}\n"]
    out += [f"c{k} {{\n  p = f32[4]{{0}} parameter(0)\n  ROOT r = f32[4]{{0}} call(p), to_apply=c{k - 1}\n}}\n"
            for k in range(1, n)]
    out.append(f"ENTRY main {{\n  p = f32[4]{{0}} parameter(0)\n  ROOT r = f32[4]{{0}} call(p), to_apply=c{n - 1}\n}}\n")
    m = parse_module("\n".join(out))
    from jaxmove.passes.timing import InstructionTime  # noqa: F401  (rows: none needed)
    w = _Walker(m, {}, {})
    assert w.comp_time("main", record=True) == 0.0
    assert len(w.memo) == n + 1


# ---- memory bounded by the input's size ------------------------------------------------------

def test_long_strings_take_memory_proportional_to_their_size():
    # a 20 MB op_name peaked at 3.66 GB (115-170 bytes a character in the backtracking
    # string regexes); 3M characters, a third of them escapes, must stay within 20 bytes each (9 here; 121 before)
    n = 3_000_000
    script = f"""
import resource
from jaxmove.hlo import parse_module
from jaxmove.hlo.attrs import parse_kv_block
name = 'a\\\\n' * {n // 3}
text = ('HloModule m\\n\\nENTRY e {{\\n  ROOT p = f32[2] parameter(0), metadata={{op_type="x" '
        'op_name="' + name + '" /*c*/}}\\n}}\\n')
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
m = parse_module(text)
md = parse_kv_block(m.entry.root.attrs['metadata'])
assert md['op_name'].startswith('a\\n') and len(md['op_name']) == {2 * n // 3}
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024)
"""
    out = subprocess.run([sys.executable, "-P", "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) < 20 * n, int(out.stdout.split()[-1]) / n


# ---- files ------------------------------------------------------------------------------------

def test_dev_zero_is_refused_as_not_a_regular_file():
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero on this system")
    with pytest.raises(HloFileError, match="device, not a regular file"):
        read_hlo_text("/dev/zero")


def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "f.hlo"
    os.mkfifo(fifo)
    with pytest.raises(HloFileError, match="FIFO"):
        read_hlo_text(fifo)


def test_file_size_cap(tmp_path, monkeypatch):
    f = tmp_path / "m.hlo"
    f.write_text(_entry("  ROOT p = f32[2] parameter(0)"))
    size = f.stat().st_size
    monkeypatch.setenv("JAXMOVE_MAX_HLO_BYTES", str(size - 1))
    with pytest.raises(HloFileError, match=f"{size} bytes, more than the {size - 1}"):
        read_hlo_text(f)
    monkeypatch.setenv("JAXMOVE_MAX_HLO_BYTES", str(size))
    assert read_hlo_text(f).startswith("HloModule m")


def test_cli_exit_2_on_dev_zero():
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero on this system")
    from jaxmove.cli import main
    assert main(["analyze", "/dev/zero"]) == 2


# ---- hardware spec files ----------------------------------------------------------------------

_SPEC = """name = "tiny"
vendor = "test"
kind = "gpu"
hbm_bytes_per_s = 1e12
hbm_capacity_bytes = 1000000
kernel_launch_overhead_s = 2e-6
devices_per_node = 1

[flops_per_s]
bf16 = 1e14

[sources]
hbm_bytes_per_s = "made up for a test"
hbm_capacity_bytes = "made up for a test"
kernel_launch_overhead_s = "made up for a test"
devices_per_node = "made up for a test"
"flops_per_s.bf16" = "made up for a test"
"""


def test_spec_toml_syntax_error_is_file_line_col():
    from jaxmove.hardware import HardwareSpecError
    from jaxmove.hardware.loader import parse_spec
    with pytest.raises(HardwareSpecError) as e:
        parse_spec(_SPEC.replace("hbm_bytes_per_s = 1e12", "hbm_bytes_per_s = = 1e12"), "s.toml")
    # line 4, column 19: the second '=' (1-based, as tomllib counts)
    assert str(e.value).startswith("s.toml:4:19: invalid TOML: "), str(e.value)
    assert "(at line" not in str(e.value)


@pytest.mark.parametrize("old, new, line", [
    ("hbm_bytes_per_s = 1e12", "hbm_bytes_per_s = 1e-300", 4),
    ("kernel_launch_overhead_s = 2e-6", "kernel_launch_overhead_s = 1e9", 6),
    ("bf16 = 1e14", "bf16 = 1e-3", 10),
    ("devices_per_node = 1", "devices_per_node = 100000000", 7),
])
def test_non_physical_spec_values_are_refused_with_their_line(old, new, line):
    # hbm_bytes_per_s = 1e-300 wrote Infinity into --json and --trace
    from jaxmove.hardware import HardwareSpecError
    from jaxmove.hardware.loader import parse_spec
    with pytest.raises(HardwareSpecError, match=rf"^s\.toml:{line}: .*outside the physical range"):
        parse_spec(_SPEC.replace(old, new), "s.toml")


def test_builtin_specs_are_within_the_physical_ranges():
    from jaxmove.hardware.loader import builtin_spec_names, load_spec
    assert all(load_spec(n).hbm_bytes_per_s >= 1e3 for n in builtin_spec_names())


# ---- sweeps: SWEEP.toml and result files ------------------------------------------------------

def test_sweep_toml_syntax_error_is_file_line_col():
    from jaxmove.sweep.spec import SweepSpecError, parse_sweep
    with pytest.raises(SweepSpecError) as e:
        parse_sweep('model = "mlp-tiny"\n[grid\n', "S.toml")
    assert str(e.value).startswith("S.toml:2:6: invalid TOML: "), str(e.value)


def test_huge_grid_is_refused_before_expanding():
    # a 10^6-point grid took 1.6 GB and 4 minutes before its first point
    import time
    from jaxmove.sweep.spec import MAX_POINTS, SweepSpecError, parse_sweep
    vals = ",".join(str(i + 1) for i in range(100))
    text = f'model = "mlp-tiny"\n[grid.set]\nbatch = [{vals}]\nd_model = [{vals}]\nlayers = [{vals}]\n'
    t0 = time.perf_counter()
    with pytest.raises(SweepSpecError, match=rf"1000000 points \(100 x 100 x 100 grid.*more than "
                                             rf"the {MAX_POINTS}.*max_points = 1000000"):
        parse_sweep(text, "S.toml")
    assert time.perf_counter() - t0 < 1.0
    with pytest.raises(SweepSpecError, match="max_points: expected a positive integer"):
        parse_sweep('model = "mlp-tiny"\nmax_points = 0\n[grid]\nplan = ["dp"]\n', "S.toml")


def test_max_points_raises_the_cap():
    from jaxmove.sweep.spec import SweepSpecError, parse_sweep
    text = 'model = "mlp-tiny"\nmax_points = {}\n[grid.set]\nbatch = [1, 2, 3]\n'
    with pytest.raises(SweepSpecError, match="3 points"):
        parse_sweep(text.format(2), "S.toml")
    assert len(parse_sweep(text.format(3), "S.toml").points) == 3


def _row(key, **kw) -> dict:
    return {"key": key, "status": "ok", "fits": True, "est_time_s": 1.0, "peak_bytes": 10, **kw}


def test_two_sweeps_cannot_write_one_file(tmp_path):
    from jaxmove.sweep.store import ResultFileError, ResultStore
    out = tmp_path / "r.jsonl"
    a = ResultStore(out)
    with pytest.raises(ResultFileError, match="another sweep is writing"):
        ResultStore(out, resume=True)
    a.add(_row("k1"))
    a.close()
    assert not (tmp_path / ".r.jsonl.lock").exists()
    with ResultStore(out, resume=True) as b:
        assert list(b.rows) == ["k1"]


def test_two_sweep_processes_on_one_parquet(tmp_path):
    pytest.importorskip("pyarrow")
    from jaxmove.sweep.store import ResultStore
    out = tmp_path / "r.parquet"
    store = ResultStore(out)
    script = ("import sys\nfrom jaxmove.sweep.store import ResultStore, ResultFileError\n"
              "try:\n    ResultStore(sys.argv[1], resume=True)\nexcept ResultFileError as e:\n"
              "    print('refused:', e); sys.exit(3)\n")
    r = subprocess.run([sys.executable, "-P", "-c", script, str(out)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 3 and "another sweep is writing" in r.stdout, r.stdout + r.stderr
    store.close()


def test_garbage_last_line_is_dropped_for_good(tmp_path):
    import json
    from jaxmove.sweep.store import ResultStore
    out = tmp_path / "r.jsonl"
    out.write_text(json.dumps(_row("k1")) + "\n" + "garbage{")   # (a write killed mid-line)
    with ResultStore(out, resume=True) as s:
        assert list(s.rows) == ["k1"] and any("incomplete last line dropped" in n for n in s.notes)
        s.add(_row("k2"))
    # the second --resume used to stop at the garbage line, no longer the last one
    with ResultStore(out, resume=True) as s:
        assert list(s.rows) == ["k1", "k2"] and not s.notes
    assert "garbage" not in out.read_text()


@pytest.mark.parametrize("bad", [{"est_time_s": "fast"}, {"peak_bytes": -1}, {"fits": "yes"},
                                 {"key": 3}, {"hbm_bytes_by_role": {"weights": "x"}}])
def test_bad_rows_are_skipped_and_reported(tmp_path, bad):
    # a string est_time_s made the ranking raise TypeError
    import json
    from jaxmove.sweep.result import rank_key
    from jaxmove.sweep.store import ResultStore
    out = tmp_path / "r.jsonl"
    out.write_text(json.dumps(_row("k1")) + "\n" + json.dumps({**_row("k2"), **bad}) + "\n"
                   + json.dumps(_row("k3", est_time_s=0.5)) + "\n")
    with ResultStore(out, resume=True) as s:
        assert list(s.rows) == ["k1", "k3"]
        assert len(s.notes) == 1 and s.notes[0].startswith(f"{out}:2: not a sweep row")
        assert [r["key"] for r in sorted(s.rows.values(), key=rank_key)] == ["k3", "k1"]


# ---- cuBLAS gemm custom calls -------------------------------------------------------------------

_GEMM = ('  a = f32[8,8]{{1,0}} parameter(0)\n'
         '  ROOT g = (f32[8,8]{{1,0}}, s8[1024]{{0}}) custom-call({ops}), custom_call_target="__cublas$gemm", '
         'backend_config={{"gemm_backend_config":{{"alpha_real":1,"beta":0,"dot_dimension_numbers":'
         '{{"lhs_contracting_dimensions":{lc},"rhs_contracting_dimensions":["0"],'
         '"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}}}}')


@pytest.mark.parametrize("ops, lc, what", [
    ("a", '["1"]', "got 1 operand"),
    ("a, a", '["x"]', "expected a list of dimension numbers"),
    ("a, a", '[1.5]', "expected a list of dimension numbers"),
    ("a, a", '["\u00b9"]', "expected a list of dimension numbers"),
    ("a, a", '["7"]', "has no dimension 7"),
    ("a, a", '["0","1"]', "differ in number or size"),
])
def test_bad_cublas_gemm_is_a_parse_error(ops, lc, what):
    # under --hardware these were IndexError / ValueError in passes/reuse.py and gpu_kernel_time.py
    e = _error(_entry(_GEMM.format(ops=ops, lc=lc)))
    assert what in e.expected and e.line == 5


def test_good_cublas_gemm_times_under_hardware(tmp_path):
    from jaxmove.api import analyze
    f = tmp_path / "gemm.hlo"
    f.write_text(_entry(_GEMM.format(ops="a, a", lc='["1"]')))
    r = analyze(str(f), hardware="h100-sxm")
    row = [x for x in r.rows if x.instr.name == "g"][0]
    assert row.total.flops == 2 * 8 * 8 * 8  # 2MNK
    assert r.times is not None and r.times.est_time_s > 0


# ---- unbounded dynamic dimensions ---------------------------------------------------------------

def test_unbounded_dynamic_dimension_is_unmodeled_not_zero_bytes():
    # f32[?] was shown as f32[<=0] with 0 bytes and complete: true
    from jaxmove.passes.pipeline import UNBOUNDED_DIM, analyze_module
    m = parse_module(_entry("  p = f32[?,4] parameter(0)\n  n = f32[?,4] negate(p)\n"
                            "  q = f32[4] parameter(1)\n  ROOT e = f32[4] exponential(q)"))
    p = m.entry.by_name["p"].shape
    assert str(p) == "f32[?,4]" and p.has_unbounded_dim and m.has_unbounded_dims
    rows = {r.instr.name: r for r in analyze_module(m).rows}
    assert UNBOUNDED_DIM in rows["n"].unmodeled and UNBOUNDED_DIM in rows["p"].unmodeled
    assert not rows["e"].unmodeled  # f32[4]: 16 B read, 16 B written, modeled
    assert rows["e"].total.hbm_read_bytes == 16 and rows["e"].total.hbm_write_bytes == 16


def test_bounded_dynamic_dimension_stays_modeled():
    from jaxmove.passes.pipeline import analyze_module
    m = parse_module(_entry("  p = f32[<=8] parameter(0)\n  ROOT n = f32[<=8] negate(p)"))
    assert not m.has_unbounded_dims and str(m.entry.root.shape) == "f32[<=8]"
    row = [r for r in analyze_module(m).rows if r.instr.name == "n"][0]
    assert not row.unmodeled and row.total.hbm_write_bytes == 32  # the bound: 8 x 4 B


def test_trace_of_a_deep_call_chain(tmp_path):
    # --hardware --trace on a 10,000-deep call chain: RecursionError in the trace's walkers
    # (passes/timing.py) and its expansion (report/trace.py); 2,000 levels pass the limit too
    from jaxmove.api import analyze
    from jaxmove.report.trace import MAX_EXPAND_DEPTH, chrome_trace
    n = 2_000
    out = ["HloModule m\n", "c0 {\n  p = f32[4]{0} parameter(0)\n  ROOT r = f32[4]{0} negate(p)\n}\n"]
    out += [f"c{k} {{\n  p = f32[4]{{0}} parameter(0)\n  ROOT r = f32[4]{{0}} call(p), to_apply=c{k - 1}\n}}\n"
            for k in range(1, n)]
    out.append(f"ENTRY main {{\n  p = f32[4]{{0}} parameter(0)\n  ROOT r = f32[4]{{0}} call(p), to_apply=c{n - 1}\n}}\n")
    f = tmp_path / "chain.hlo"
    f.write_text("\n".join(out))
    trace = chrome_trace(analyze(str(f), hardware="h100-sxm"))
    blocks = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    assert len(blocks) == MAX_EXPAND_DEPTH + 1  # one call block per level shown
    notes = trace.get("otherData", trace).get("notes", [])
    assert any(f"deeper than {MAX_EXPAND_DEPTH} levels" in x for x in notes)


@pytest.mark.parametrize("choice", ["\u00b2", "\u0664"])
def test_dump_module_number_in_other_digits_is_no_such_module(tmp_path, choice):
    # --module ² was an internal error (isdigit() true, int() raises); --module ٤ took module 4
    from jaxmove.capture.dumps import choose_module, list_modules
    from jaxmove.errors import JaxmoveInputError
    text = _entry("  ROOT p = f32[4] parameter(0)")
    for name in ("module_0002.jit_a.cpu_after_optimizations.txt",
                 "module_0004.jit_b.cpu_after_optimizations.txt"):
        (tmp_path / name).write_text(text)
    with pytest.raises(JaxmoveInputError, match="no such module"):
        choose_module(list_modules(tmp_path), choice, tmp_path)


def test_a_store_that_cannot_open_leaves_no_lock(tmp_path):
    from jaxmove.sweep.store import ResultFileError, ResultStore
    out = tmp_path / "r.jsonl"
    out.write_text('{"key": "k1"}\n')
    with pytest.raises(ResultFileError, match="exists"):
        ResultStore(out)
    assert not (tmp_path / ".r.jsonl.lock").exists()
    with ResultStore(out, resume=True) as s:
        assert list(s.rows) == ["k1"]
