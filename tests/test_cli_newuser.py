"""Issue 29: a new user's hour with the README, and the CLI attacked on purpose.

Each test names the item it covers; every one failed on the code before the fix.
"""

from __future__ import annotations

import argparse

import pytest

from jaxmove.cli import main


def _err_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.strip()]


# ---- item 3: --trace with a device --target needs no --hardware ------------------------------

def test_trace_with_a_device_target_implies_its_hardware(tmp_path):
    from jaxmove.cli.common import check_outputs
    from jaxmove.errors import UsageError

    out = str(tmp_path / "t.json")
    for target in ("h100-sxm", "tpu-v5e:2x2", "H100-SXM:1x1x2"):   # implies --hardware (README)
        check_outputs(argparse.Namespace(trace=out, hardware=None, compile_target=target))
    for target in (None, "cpu"):  # XLA:CPU has no device spec to time on: still refused
        with pytest.raises(UsageError, match="--trace needs --hardware or a device --target"):
            check_outputs(argparse.Namespace(trace=out, hardware=None, compile_target=target))


# ---- item 5: did you mean ----------------------------------------------------------------------

def test_a_mistyped_preset_gets_a_did_you_mean(capsys):
    assert main(["analyze", "llama3-8b-decod"]) == 2
    (line,) = _err_lines(capsys.readouterr().err)
    assert "did you mean 'llama3-8b-decode'" in line, line
    assert main(["analyze", "zzzz-qqqq"]) == 2  # nothing close: no suggestion
    (line,) = _err_lines(capsys.readouterr().err)
    assert "did you mean" not in line and "is not a zoo preset" in line


def test_a_mistyped_target_gets_a_did_you_mean(capsys):
    assert main(["analyze", "mlp-tiny", "--target", "h100-sx"]) == 2
    (line,) = _err_lines(capsys.readouterr().err)
    assert "did you mean 'h100-sxm'?" in line, line
