"""The does-not-fit exit rule (issue 29) for ``annotate`` and ``analyze --xla`` as for ``analyze``:
exit 2 with one line on stderr after the output, when the program's arguments exceed the spec's
``hbm_capacity_bytes`` (cli/common.py ``fit_status``)."""

from __future__ import annotations

import pytest

from jaxmove.capture.program import memory_analysis_peak_bytes
from jaxmove.cli import main
from jaxmove.hardware import load_spec
from jaxmove.hlo import parse_module

# f32[N] arguments: 4 N bytes, N chosen against the spec's capacity (nothing is allocated)


def _hlo(n: int) -> str:
    return (f"HloModule big\n\nENTRY main {{\n  p0 = f32[{n}]{{0}} parameter(0)\n"
            f"  ROOT n = f32[{n}]{{0}} negate(p0)\n}}\n")


@pytest.fixture
def sizes():
    cap = load_spec("a100-40gb").hbm_capacity_bytes
    return cap // 4 + 1, cap // 4   # 4 B more than the capacity / exactly the capacity: fits


def _lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.strip()]


@pytest.mark.parametrize("command", [["annotate"], ["analyze", "--xla"], ["analyze", "--xla", "--json"]])
def test_does_not_fit_exits_2_with_one_line_after_the_output(tmp_path, capsys, sizes, command):
    big, fits = sizes
    f = tmp_path / "big.hlo"
    f.write_text(_hlo(big))
    cap = load_spec("a100-40gb").hbm_capacity_bytes
    rc = main([command[0], str(f), "--hardware", "a100-40gb", *command[1:]])
    out, err = capsys.readouterr()
    assert rc == 2, err                                   # annotate exited 0
    (line,) = _lines(err)
    assert line.startswith("jaxmove: error: big does not fit:")
    assert f"hbm_capacity_bytes = {cap:,} B of spec a100-40gb" in line
    assert out.strip()                                    # the output is still written, first
    f.write_text(_hlo(fits))
    rc = main([command[0], str(f), "--hardware", "a100-40gb", *command[1:]])
    out, err = capsys.readouterr()
    assert rc == 0 and "does not fit" not in out + err


def test_annotate_says_it_first_and_still_parses(tmp_path, capsys, sizes):
    f = tmp_path / "big.hlo"
    f.write_text(_hlo(sizes[0]))
    o = tmp_path / "a.hlo"
    assert main(["annotate", str(f), "--hardware", "a100-40gb", "-o", str(o)]) == 2
    err = capsys.readouterr().err
    assert _lines(err)[0] == f"jaxmove: wrote {o}" and "does not fit:" in _lines(err)[1]
    text = o.read_text()
    assert text.startswith("// does not fit: the program's arguments take")
    assert [i.name for i in parse_module(text).instructions()] == ["p0", "n"]


def test_annotate_without_hardware_checks_nothing(tmp_path, capsys, sizes):
    f = tmp_path / "big.hlo"
    f.write_text(_hlo(sizes[0]))
    assert main(["annotate", str(f)]) == 0
    assert "does not fit" not in capsys.readouterr().err


def test_a_compiled_program_needs_its_outputs_and_temporaries_too(capsys):
    """A compiled program (memory_analysis known) needs arguments + outputs - aliased +
    temporaries, the sum ``plans`` compares (plans/compare.py summarize): a capacity one byte
    short of it does not fit although the arguments alone do; exactly that much fits."""
    import jaxmove

    ms = jaxmove.resolve_program("mlp-tiny").memory_stats   # XLA:CPU's own figures
    need = (ms["argument_size_in_bytes"] + ms["output_size_in_bytes"] - ms["alias_size_in_bytes"]
            + ms["temp_size_in_bytes"])
    assert ms["argument_size_in_bytes"] < need - 1 and ms["temp_size_in_bytes"] > 0
    rc = main(["analyze", "mlp-tiny", "--hardware", "cpu-generic", "--spec", f"hbm_capacity_bytes={need - 1}"])
    out, err = capsys.readouterr()
    assert rc == 2, err
    (line,) = _lines(err)
    assert line.startswith("jaxmove: error: mlp-tiny does not fit: the program needs")
    assert f"temporaries {ms['temp_size_in_bytes'] / 1024:.2f} KiB" in line
    assert out.strip()                                    # the report is still printed, first
    rc = main(["analyze", "mlp-tiny", "--hardware", "cpu-generic", "--spec", f"hbm_capacity_bytes={need}"])
    out, err = capsys.readouterr()
    assert rc == 0 and "does not fit" not in out + err


@pytest.mark.parametrize("target,module", [("h100-sxm:1x1x1", "jax_plugins.xla_cuda12"), ("tpu-v5e:1x1", "libtpu")])
def test_the_needs_bytes_rule_on_accelerator_programs(capsys, target, module):
    """XLA:GPU compiled without the device checks no memory: its program is judged by the
    memory_analysis figures like XLA:CPU's. XLA:TPU checks its own chip's memory and refuses
    what does not fit; a capacity the user gives (``--spec hbm_capacity_bytes``) is another
    question, which jaxmove answers with the same figures on every target (a user trial saw a
    TPU program 'fit' an override smaller than its arguments)."""
    import importlib.util

    import jaxmove

    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (the gpu / tpu extra)")
    ms = jaxmove.resolve_program("mlp-tiny", target=target).memory_stats   # the compiler's figures
    need = (ms["argument_size_in_bytes"] + ms["output_size_in_bytes"] - ms["alias_size_in_bytes"]
            + ms["temp_size_in_bytes"])
    # never below the compiler's own peak (XLA:TPU's counts temporaries its temp_size leaves out)
    peak = memory_analysis_peak_bytes(ms)
    assert peak == max(need, ms["peak_memory_in_bytes"]) >= ms["peak_memory_in_bytes"]
    assert ms["argument_size_in_bytes"] < peak - 1
    rc = main(["analyze", "mlp-tiny", "--target", target, "--spec", f"hbm_capacity_bytes={peak - 1}"])
    err = capsys.readouterr().err
    assert rc == 2 and _lines(err)[-1].startswith("jaxmove: error: mlp-tiny does not fit: the program needs")
    assert main(["analyze", "mlp-tiny", "--target", target, "--spec", f"hbm_capacity_bytes={peak}"]) == 0


@pytest.mark.parametrize("stats,expected", [
    # XLA:CPU: its peak leaves the temporaries out, the sum is larger
    ({"argument_size_in_bytes": 100, "output_size_in_bytes": 50, "alias_size_in_bytes": 20,
      "temp_size_in_bytes": 30, "peak_memory_in_bytes": 130}, 100 + 50 - 20 + 30),
    # XLA:TPU: temp_size 0, the peak (190,413,312 B summed vs 284,052,992 B, a user trial's
    # gpt2-small-prefill layers=2 under tp on tpu-v5e:2x4) is the larger
    ({"argument_size_in_bytes": 85_899_264, "output_size_in_bytes": 104_514_048, "alias_size_in_bytes": 0,
      "temp_size_in_bytes": 0, "peak_memory_in_bytes": 284_052_992}, 284_052_992),
    # no peak reported: the sum
    ({"argument_size_in_bytes": 8, "output_size_in_bytes": 4, "temp_size_in_bytes": 2}, 14),
    # an HLO file: no figures
    ({}, None),
])
def test_needs_bytes_is_the_larger_of_the_sum_and_the_compilers_peak(stats, expected):
    assert memory_analysis_peak_bytes(stats) == expected


def test_tpu_peak_is_the_compilers_own():
    """XLA:TPU's temp size is no HBM figure to add (0 where temporaries take 94 MB of the peak;
    1,838,592 B in gpt-tiny-decode under tp on tpu-v5e:2x2, whose peak is 576,512 B): on TPU
    the figure is XLA's peak_memory_in_bytes; elsewhere the larger of the sum and the peak."""
    tiny_tp = {"argument_size_in_bytes": 416_768, "output_size_in_bytes": 66_560, "alias_size_in_bytes": 65_536,
               "temp_size_in_bytes": 1_838_592, "peak_memory_in_bytes": 576_512}
    assert memory_analysis_peak_bytes(tiny_tp, "tpu") == 576_512
    assert memory_analysis_peak_bytes(tiny_tp) == 416_768 + 66_560 - 65_536 + 1_838_592
    gpt2_tp = {"argument_size_in_bytes": 85_899_264, "output_size_in_bytes": 104_514_048, "alias_size_in_bytes": 0,
               "temp_size_in_bytes": 0, "peak_memory_in_bytes": 284_052_992}
    assert memory_analysis_peak_bytes(gpt2_tp, "tpu") == 284_052_992
    # no peak reported: the sum, on TPU too
    assert memory_analysis_peak_bytes({"argument_size_in_bytes": 8, "output_size_in_bytes": 4,
                                       "temp_size_in_bytes": 2}, "tpu") == 14


def test_plans_tpu_peak_of_gpt_tiny_tp_is_xlas(capsys):
    """End to end on the compiler's own figures (the TPU extra): plans' peak on a TPU target is
    XLA:TPU's peak_memory_in_bytes, not the sum with its temp size."""
    import importlib.util
    import json

    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed (the tpu extra)")
    assert main(["plans", "gpt-tiny-decode", "--target", "tpu-v5e:2x2", "--mesh", "data=2,model=2",
                 "--plan", "tp", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    (p,) = got["plans"] if isinstance(got, dict) else got
    assert p["xla_peak_bytes"] and p["peak_bytes"] == p["xla_peak_bytes"]


def test_figure_is_the_compilers_when_arguments_alone_do_not_fit():
    """Arguments over the capacity: the note gave their bytes (256 GiB, 3.44x) although XLA's
    memory_analysis said the program needs 1.5 TiB (mlp-tiny batch=2147483647 on h100-sxm):
    the figure is never below the compiler's."""
    from jaxmove.api import does_not_fit_note
    from jaxmove.hardware import load_spec
    from jaxmove.hlo import parse_module

    m = parse_module("HloModule m\n\nENTRY e {\n  ROOT p = f32[1000000000] parameter(0)\n}\n")  # 4 GB
    spec = load_spec("h100-sxm")
    ms = {"argument_size_in_bytes": 4_000_000_000, "output_size_in_bytes": 4_000_000_000,
          "alias_size_in_bytes": 0, "temp_size_in_bytes": 200_000_000_000, "peak_memory_in_bytes": 0}
    import dataclasses
    small = dataclasses.replace(spec, hbm_capacity_bytes=3_000_000_000)
    note = does_not_fit_note(m, small, ms, "gpu")
    assert note.startswith("does not fit: the program needs")
    from jaxmove.units import human_bytes
    assert human_bytes(208_000_000_000) in note
    # without memory_analysis figures (an HLO file): the arguments
    assert does_not_fit_note(m, small, None, None).startswith("does not fit: the program's arguments take")


def test_a_cpu_program_costed_on_a_gpu_spec_is_judged_by_its_arguments():
    """XLA:CPU computes a bf16 dot in f32: its memory_analysis counts an f32 copy of the weight
    among its temporaries, which no GPU program has. Costed on h100-sxm, the program was said
    not to fit by those figures (a user trial: llama3-8b-decode --hardware h100-sxm, "needs
    75.90 GiB ... temporaries 28.93 GiB", exit 2). The arguments alone decide there."""
    import jax
    import jax.numpy as jnp

    import jaxmove
    from jaxmove.hardware.overrides import override_spec
    w = jax.ShapeDtypeStruct((2048, 2048), jnp.bfloat16)
    x = jax.ShapeDtypeStruct((8, 2048), jnp.bfloat16)
    args_bytes = 2048 * 2048 * 2 + 8 * 2048 * 2
    f = lambda w, x: x @ w   # noqa: E731
    from jaxmove.capture.program import capture
    cpu_peak = memory_analysis_peak_bytes(capture(f, w, x, roles=("weights", "activations")).memory_stats, "cpu")
    assert cpu_peak > args_bytes + 2048 * 2048 * 2     # (XLA:CPU's f32 copy of w, at least)

    out_bytes = 8 * 2048 * 2
    cap = args_bytes + out_bytes + 1024                # arguments + outputs fit, XLA:CPU's peak does not
    for name in ("h100-sxm", "cpu-generic"):
        spec = override_spec(load_spec(name), {"hbm_capacity_bytes": cap})
        notes = jaxmove.analyze(f, w, x, hardware=spec).notes
        fit = [n for n in notes if n.startswith("does not fit")]
        if name == "cpu-generic":   # (XLA:CPU's figures are the CPU's own)
            assert fit and "memory_analysis" in fit[0]
        else:
            assert not fit, fit
    spec = override_spec(load_spec("h100-sxm"), {"hbm_capacity_bytes": args_bytes + out_bytes - 1})
    (fit,) = [n for n in jaxmove.analyze(f, w, x, hardware=spec).notes if n.startswith("does not fit")]
    assert f"needs {(args_bytes + out_bytes) / 2**20:.2f} MiB" in fit
    # outputs count (they are the function's own, on any device): an outer product of two
    # f32[200000] is 149.01 GiB, more than an H100's 74.51 GiB (it was said to fit)
    a = jax.ShapeDtypeStruct((200_000,), jnp.float32)
    (fit,) = [n for n in jaxmove.analyze(jnp.outer, a, a, hardware="h100-sxm").notes
              if n.startswith("does not fit")]
    assert "outputs 149.01 GiB" in fit and "XLA:CPU's temporaries not counted" in fit
