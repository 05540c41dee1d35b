"""benchmarks/anchors.py: the anchors' commands and the table (the full run is the benchmark)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import anchors  # noqa: E402


def _anchors():
    if not anchors.DATA.is_file():
        pytest.skip(f"{anchors.DATA} not found (the measured anchors live in ../shared/data)")
    return {a["id"]: a for a in anchors.read_anchors()}


def test_every_anchor_has_a_command():
    got = _anchors()
    assert set(got) == set(anchors.COMMANDS) and len(got) == 8
    for i, args in anchors.COMMANDS.items():
        assert "--target" in args
        # FasterTransformer: A100 40GB; gpt-fast: A100 80GB at its stated 1700 GB/s
        if i.startswith("ft13b"):
            assert args[args.index("--target") + 1].startswith("a100-40gb")
            assert "--xla_gpu_enable_command_buffer=" in anchors.command_text(i)
        else:
            assert args[args.index("--target") + 1].startswith("a100-80gb")
            assert "hbm_bytes_per_s=1.7e12" in args
        devices = int(got[i]["devices"])
        if devices > 1:
            assert f"model={devices}" in args
    assert (ROOT / "benchmarks" / "anchors_gptfast_tp.toml").is_file()


def test_table_ratio_and_bound():
    got = _anchors()
    report = {"time": {"est_time_s": 0.0105, "compute_time_s": 0.001, "memory_time_s": 0.009,
                       "network_time_s": 0.0, "overhead_s": 0.0015, "kernels": 500, "bound": "memory",
                       "unmodeled": []},
              "totals": {"hbm_read_bytes": 16_000_000_000, "hbm_write_bytes": 1_000_000_000, "flops": 10**10,
                         "collective_wire_bytes": 0}}
    s = anchors.summary(report)
    b, term = anchors.roofline_bound_s("gptfast_7b_bf16", s)
    assert term == "memory" and b == pytest.approx(17e9 / 1.7e12)  # the --spec bandwidth
    text = anchors.render([{"id": "gptfast_7b_bf16", "summary": s, "bound": (b, term)}], got)
    # 10.5 ms against the measured 9.53 ms: ratio 1.10, within 15%
    assert "| gptfast_7b_bf16 | 9.53 | 10.50 | 1.10 |" in text and "1 of 1 anchors within" in text
