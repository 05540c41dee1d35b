"""``jaxmove plans --jobs N`` / ``compare_plans(jobs=N)``: plans compiled in worker processes
give the results of the serial run, in its order; the compile cache's figures come back from
the workers."""

from __future__ import annotations

import pytest

from tests import device_compile  # noqa: F401 - JAX_PLATFORMS=cpu, ALLOW_MULTIPLE_LIBTPU_LOAD

from jaxmove.capture import compile_cache as cc
from jaxmove.plans import compare as compare_mod

TARGET = "h100-sxm:1x1x2"
PLANS = ["dp", "tp"]


def _gpu():
    from jaxmove.capture.targets import MissingExtraError, Target
    t = Target.parse(TARGET)
    try:
        t.devices()
    except (MissingExtraError, Exception) as e:  # noqa: BLE001
        pytest.skip(f"{TARGET} not available: {e}")
    return t


def _comparable(cmp) -> list[dict]:
    out = []
    for r in cmp.to_json()["plans"]:
        r = dict(r)
        r.pop("compile_s")  # wall time of the compile (or of the cache read)
        out.append(r)
    return out


def test_default_jobs_is_serial_on_two_cpus(monkeypatch):
    import os
    for cpus, plans, want in ((1, 4, 1), (2, 4, 1), (4, 4, 2), (16, 3, 3), (64, 8, 4), (8, 1, 1)):
        monkeypatch.setattr(os, "cpu_count", lambda c=cpus: c)
        assert compare_mod.default_jobs(plans) == want, (cpus, plans)


def test_parallel_plans_equal_the_serial_ones(tmp_path, monkeypatch):
    from jaxmove.plans import compare_plans

    _gpu()
    monkeypatch.delenv(cc.DISABLE_ENV, raising=False)
    monkeypatch.setenv(cc.DIR_ENV, str(tmp_path / "xla"))
    serial = compare_plans("mlp-tiny", None, PLANS, target=TARGET, jobs=1)
    assert serial.compile_cache == {"dir": str(tmp_path / "xla"), "reused": 0, "compiled": 2}
    # the workers compile again: the optimized HLO holds the call stack (its StackFrames
    # table), so a compile called from a worker is not the serial run's entry; their counts
    # come back to this process (which compiles nothing itself)
    par = compare_plans("mlp-tiny", None, PLANS, target=TARGET, jobs=2)
    assert par.compile_cache == {"dir": str(tmp_path / "xla"), "reused": 0, "compiled": 2}
    assert len(list((tmp_path / "xla").glob("*.json.gz"))) == 4
    assert _comparable(par) == _comparable(serial)
    assert [r.plan for r in par.results] == [r.plan for r in serial.results]
    assert all(r.error is None for r in par.results)


def test_jobs_below_one_is_an_error():
    from jaxmove.plans import PlanError, compare_plans

    _gpu()
    with pytest.raises(PlanError, match="jobs=0"):
        compare_plans("mlp-tiny", None, PLANS, target=TARGET, jobs=0)


def test_cli_jobs_rejects_zero(capsys):
    from jaxmove.cli import main

    with pytest.raises(SystemExit) as e:
        main(["plans", "mlp-tiny", "--target", TARGET, "--jobs", "0"])
    assert e.value.code == 2
    assert "--jobs" in capsys.readouterr().err
