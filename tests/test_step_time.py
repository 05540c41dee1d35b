"""Step time (issue 26): GPU command buffers' launch gaps, kept apart from kernel durations."""

from __future__ import annotations

import pytest

from jaxmove.hardware import load_spec
from jaxmove.hlo import parse_module
from jaxmove.passes.pipeline import analyze_module
from jaxmove.passes.timing import CommandBufferConfig, command_buffer_runs, estimate_times


def _module(n_before: int, n_after: int) -> str:
    """n_before negate fusions, an all-reduce, n_after more; each fusion reads and writes 4 KiB."""
    lines = ["HloModule m, is_scheduled=true", "",
             "%fc (p: f32[1024]) -> f32[1024] {", "  %p = f32[1024] parameter(0)",
             "  ROOT %n = f32[1024] negate(%p)", "}", "",
             "%sum (a: f32[], b: f32[]) -> f32[] {", "  %a = f32[] parameter(0)", "  %b = f32[] parameter(1)",
             "  ROOT %s = f32[] add(%a, %b)", "}", "",
             "ENTRY %e (x: f32[1024]) -> f32[1024] {", "  %x = f32[1024] parameter(0)"]
    prev = "%x"
    for i in range(n_before):
        lines.append(f"  %f{i} = f32[1024] fusion({prev}), kind=kLoop, calls=%fc")
        prev = f"%f{i}"
    lines.append(f"  %ar = f32[1024] all-reduce({prev}), replica_groups={{{{0,1}}}}, to_apply=%sum")
    prev = "%ar"
    for i in range(n_after):
        lines.append(f"  %g{i} = f32[1024] fusion({prev}), kind=kLoop, calls=%fc")
        prev = f"%g{i}"
    lines.append(f"  ROOT %out = f32[1024] bitcast({prev})")
    lines.append("}")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def spec():
    return load_spec("h100-sxm")


def test_runs_of_five_or_more_become_command_buffers(spec, monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    m = parse_module(_module(6, 3))
    runs = command_buffer_runs(m.entry, m)
    # XLA:GPU's default xla_gpu_graph_min_graph_size = 5: the 6 fusions before the all-reduce
    # are one command buffer, the 3 after stay stream launches; the all-reduce breaks the run
    assert runs == [[f"f{i}" for i in range(6)]]
    t = estimate_times(analyze_module(m), spec)
    launch, gap = spec.kernel_launch_overhead_s, spec.command_buffer_launch_overhead_s
    assert (launch, gap) == (2e-6, 5e-7)
    # 6 kernels x 0.5 us + one command-buffer launch 2 us; 3 fusions + the all-reduce x 2 us
    want = 6 * gap + launch + 4 * launch
    assert t.launch_gap_s == pytest.approx(want)
    assert (t.command_buffers, t.command_buffer_kernels) == (1, 6)
    assert t.row("e", "f0").launch_gap_s == pytest.approx(gap + launch)
    assert t.row("e", "f1").launch_gap_s == pytest.approx(gap) and t.row("e", "f1").in_command_buffer
    assert t.row("e", "g0").launch_gap_s == pytest.approx(launch) and not t.row("e", "g0").in_command_buffer
    # durations: 4 KiB read + 4 KiB written per fusion at 3.35 TB/s, no gap in them
    assert t.row("e", "f1").duration_s == pytest.approx(8192 / 3.35e12)
    assert t.kernel_duration_s == pytest.approx(t.serial_time_s - want)


def test_xla_flags_turn_command_buffers_off(spec, monkeypatch):
    m = parse_module(_module(6, 3))
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_command_buffer=")
    off = estimate_times(analyze_module(m), spec)
    assert off.command_buffers == 0 and off.launch_gap_s == pytest.approx(10 * 2e-6)
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_graph_min_graph_size=3")
    three = estimate_times(analyze_module(m), spec)
    assert three.command_buffers == 2 and three.command_buffer_kernels == 9
    # collectives in command buffers (gpt-fast's CUDA graphs hold its NCCL calls): one run of 10
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_command_buffer=+COLLECTIVES")
    coll = estimate_times(analyze_module(m), spec)
    assert (coll.command_buffers, coll.command_buffer_kernels) == (1, 10)
    assert coll.launch_gap_s == pytest.approx(10 * 5e-7 + 2e-6)
    monkeypatch.delenv("XLA_FLAGS")
    on = estimate_times(analyze_module(m), spec)
    # the kernels' durations do not depend on how they are launched
    assert off.kernel_duration_s == pytest.approx(on.kernel_duration_s)
    assert off.est_time_s - on.est_time_s == pytest.approx(off.launch_gap_s - on.launch_gap_s)


def test_command_buffer_config_parsing():
    assert CommandBufferConfig.from_xla_flags("").types >= {"FUSION", "CUBLAS"}
    assert CommandBufferConfig.from_xla_flags("--xla_gpu_enable_command_buffer=''").types == frozenset()
    c = CommandBufferConfig.from_xla_flags("--xla_gpu_enable_command_buffer=-FUSION,+WHILE")
    assert "FUSION" not in c.types and "WHILE" in c.types and "CUBLAS" in c.types


def test_tpu_and_cpu_specs_have_no_command_buffers(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    m = parse_module(_module(6, 0))
    t = estimate_times(analyze_module(m), load_spec("tpu-v5e"))
    assert t.command_buffers == 0
    assert t.launch_gap_s == pytest.approx(7 * load_spec("tpu-v5e").kernel_launch_overhead_s)


# ---- TPU: which instructions are kernels, and XLA:TPU's own estimate ----------------------

def _tpu_module(cycles: int) -> str:
    """A weight prefetched by copy-start/done (a DMA), a scalar add, and one fusion of 4 KiB in
    and out that XLA:TPU estimates at ``cycles``."""
    return f"""HloModule m, is_scheduled=true

%fc (p: f32[1024]) -> f32[1024] {{
  %p = f32[1024] parameter(0)
  ROOT %n = f32[1024] negate(%p)
}}

ENTRY %e (x: f32[1024], w: f32[1024], i: s32[]) -> (f32[1024], f32[1024], s32[]) {{
  %x = f32[1024] parameter(0)
  %w = f32[1024] parameter(1)
  %i = s32[] parameter(2)
  %cs = (f32[1024], f32[1024], u32[]) copy-start(%w)
  %one = s32[] constant(1)
  %i1 = s32[] add(%i, %one)
  %f = f32[1024] fusion(%x), kind=kLoop, calls=%fc, backend_config={{"window_config":{{"estimated_cycles":"{cycles}"}}}}
  %cd = f32[1024] copy-done(%cs)
  ROOT %t = (f32[1024], f32[1024], s32[]) tuple(%f, %cd, %i1)
}}
"""


def test_tpu_dma_starts_and_scalar_ops_are_not_kernels(tmp_path):
    import jaxmove
    p = tmp_path / "tpu.hlo"
    p.write_text(_tpu_module(1900))
    rep = jaxmove.analyze(str(p), hardware="tpu-v5e")
    t = rep.times
    # tpu-v5e.toml: 1825 cycles / 1.5e9 Hz (XLA:TPU's least estimate for a kernel touching HBM)
    assert load_spec("tpu-v5e").kernel_launch_overhead_s == 1.22e-6
    assert t.row("e", "f").launch_gap_s == pytest.approx(1.22e-6)
    assert t.row("e", "cs").launch_gap_s == 0.0  # the DMA engine runs it
    assert t.row("e", "i1").launch_gap_s == 0.0  # the scalar unit
    assert t.kernels == 1
    # 1900 cycles at 1.5 GHz = 1.27 us; ours 1.22 us + 8 KiB / 819 GB/s = 1.23 us: no note
    assert not any("XLA:TPU estimates" in n for n in t.notes)


def test_a_2x_disagreement_with_xla_tpu_says_where(tmp_path):
    import jaxmove
    p = tmp_path / "tpu.hlo"
    p.write_text(_tpu_module(30000))  # XLA: 20 us; ours 1.23 us
    t = jaxmove.analyze(str(p), hardware="tpu-v5e").times
    (note,) = [n for n in t.notes if "XLA:TPU estimates" in n]
    assert "0.062x" in note and "largest difference is f (fusion" in note
    assert "XLA 2e-05 s" in note
