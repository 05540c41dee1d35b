"""benchmarks/gpu_table_kernels.py: the device script that records which kernels XLA runs for
the GEMM table's programs. Checked here on the CPU (its "kernels" are XLA:CPU thunks)."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import gpu_table_kernels as gtk  # noqa: E402

from jaxmove.measure.profile import TraceEvent  # noqa: E402


def _ev(start, dur, run=None, name="k"):
    return TraceEvent("jit_f", "op", name, float(start), float(dur), run, 0, "/device:GPU:0", "stream")


def test_runs_grouped_by_run_id_or_split_in_launch_order():
    evs = [_ev(30, 1, 2, "b"), _ev(10, 1, 1, "a"), _ev(40, 1, 2, "a"), _ev(20, 1, 1, "b")]
    assert [[e.start_ns for e in r] for r in gtk.runs_of(evs, 2)] == [[10, 20], [30, 40]]
    no_id = [_ev(s, 1) for s in (50, 10, 40, 20, 30, 60)]
    assert [[e.start_ns for e in r] for r in gtk.runs_of(no_id, 3)] == [[10, 20], [30, 40], [50, 60]]
    with pytest.raises(ValueError, match="5 kernel events do not split into 2 runs"):
        gtk.runs_of(no_id[:5], 2)


def test_hlo_kernels_lists_fusion_kinds_and_custom_call_targets():
    hlo = """HloModule m
fused_computation { p = f32[4] parameter(0) ROOT n = f32[4] negate(p) }
ENTRY e {
  a = f8e4m3fn[1,256,256]{2,1,0} parameter(0)
  t = f8e4m3fn[1,256,256]{2,1,0} fusion(a), kind=kLoop, calls=fused_computation
  g = (bf16[1,256,256]{2,1,0}, s8[0]{0}) custom-call(a, t), custom_call_target="__cublas$lt$matmul$f8"
  ROOT d = bf16[1,256,256]{2,1,0} fusion(g), kind=kCustom, calls=fused_computation, backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}
}
"""
    assert gtk.hlo_kernels(hlo) == "fusion:kLoop;custom-call:__cublas$lt$matmul$f8;fusion:__triton_gemm"


def test_selection_inverted_region():
    pd = pytest.importorskip("pandas")
    rows = [(b, m, n, k, dk) for b in (1, 2) for m in (256, 4096) for n in (256, 4096)
            for k in (256, 4096) for dk in ("bf16xbf16->bf16", "f8e5m2xf8e4m3fn->bf16")]
    t = pd.DataFrame(rows, columns=["b", "m", "n", "k", "dtype_key"])
    got = {tuple(r) for r in gtk.select_rows(t, "inverted")[["b", "m", "n", "k", "dtype_key"]].itertuples(index=False)}
    # b = 1, m, n <= 1024, k <= 2048 (only 256^3 here) and 4096^3, for the listed dtypes only
    assert got == {(1, 256, 256, 256, "bf16xbf16->bf16"), (1, 4096, 4096, 4096, "bf16xbf16->bf16")}
    assert len(gtk.select_rows(t, "all")) == len(t)


def test_end_to_end_on_cpu(tmp_path):
    table = tmp_path / "t.csv"
    table.write_text("device_key,b,m,n,k,dtype_key,flops_per_s,time_s\n"
                     "sm_90,1,256,256,256,bf16xbf16->bf16,6.7e12,5e-6\n"
                     "sm_90,1,256,256,256,f32xf32->f32,6.0e12,5.6e-6\n")
    out = tmp_path / "k.csv"
    assert gtk.main(["--out", str(out), "--table", str(table), "--allow-cpu", "--runs", "3",
                     "--warmup", "1"]) == 0
    got = list(csv.DictReader(out.open()))
    assert [(r["m"], r["dtype_key"]) for r in got] == [("256", "bf16xbf16->bf16"), ("256", "f32xf32->f32")]
    for r in got:
        names, durs = r["kernel_names"].split(";"), [float(x) for x in r["kernel_us"].split(";")]
        assert int(r["kernels_per_run"]) == len(names) == len(durs) >= 1
        assert int(r["runs"]) == 3
        assert float(r["table_h100_us"]) in (5.0, 5.6)
        assert float(r["median_kernel_us"]) > 0 and float(r["run_kernel_sum_us"]) > 0
        if len(names) == 1:  # one kernel a run: the median kernel is the median run
            assert float(r["median_kernel_us"]) == pytest.approx(float(r["run_kernel_sum_us"]), abs=1e-3)
        assert r["hlo_kernels"]  # the CPU program has at least one fusion


def test_refuses_without_gpu(tmp_path, capsys):
    assert gtk.main(["--out", str(tmp_path / "k.csv"), "--table", str(tmp_path / "none.csv")]) == 2
    assert "no GPU" in capsys.readouterr().err
    assert not (tmp_path / "k.csv").exists()
