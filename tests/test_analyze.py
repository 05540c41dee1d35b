"""End to end: zoo models through capture, passes and report, against closed-form bytes and flops;
the CLI's exit codes and JSON contract."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import jaxmove
from jaxmove import zoo as models
from jaxmove.cli import main
from jaxmove.passes.pipeline import KV_COPY, KV_REWRITE


def cfg_of(preset, overrides):
    c = models.build(preset, overrides).config
    return c["layers"], c["batch"], c["seq_len"], c["kv_heads"], c["d_model"] // c["heads"], c


def touched_weight_bytes(c, b):
    """Parameter bytes one decode step touches: every layer weight, the final LayerNorm, the
    whole token embedding (GPT-2's tied LM head reads all of it), and one row of the position
    embedding (all sequences are at the same position)."""
    V, d, H, Hkv, L = c["vocab"], c["d_model"], c["heads"], c["kv_heads"], c["layers"]
    D, F = d // H, 4 * d
    per_layer = (
        4 * d                                   # ln1, ln2 scale + bias
        + d * H * D + H * D                     # query
        + 2 * (d * Hkv * D + Hkv * D)           # key, value
        + H * D * d + d                         # out
        + d * F + F + F * d + d                 # mlp
    )
    return (L * per_layer + 2 * d + V * d + d) * b


@pytest.mark.parametrize("kv_heads", ["4", "2"])   # MHA, GQA
def test_decode_f32_cache_updated_in_place(kv_heads):
    ov = {"kv_heads": kv_heads}
    L, B, S, Hkv, D, c = cfg_of("gpt-tiny-decode", ov)
    b = 4
    r = jaxmove.analyze("gpt-tiny-decode", overrides=ov)
    t = r.totals
    cache_bytes = 2 * L * B * S * Hkv * D * b
    assert abs(t.kv_cache_read_bytes - cache_bytes) <= 0.05 * cache_bytes
    assert t.kv_cache_write_bytes == 2 * L * B * Hkv * D * b        # new entries only
    w = touched_weight_bytes(c, b)
    assert abs(t.weights_read_bytes - w) <= 0.05 * w
    assert not any(KV_REWRITE in n or KV_COPY in n for row in r.rows for n in row.notes)


def test_decode_bf16_cache_rewritten_whole_on_cpu_and_said_why():
    ov = {"dtype": "bfloat16"}
    L, B, S, Hkv, D, _ = cfg_of("gpt-tiny-decode", ov)
    r = jaxmove.analyze("gpt-tiny-decode", overrides=ov)
    whole_bf16 = 2 * L * B * S * Hkv * D * 2
    t = r.totals
    # XLA:CPU converts the bf16 cache to f32 around the update: the whole cache is read and
    # written (at least once each), far above the new entries.
    assert t.kv_cache_read_bytes >= whole_bf16
    assert t.kv_cache_write_bytes >= whole_bf16
    noted = [row for row in r.rows if any(n.startswith(KV_REWRITE) for n in row.notes)]
    assert noted, "the report must say which instructions rewrite the cache"
    assert sum(row.total.kv_cache_write_bytes for row in noted) >= whole_bf16
    assert any("rewrite a whole KV-cache buffer instead of updating it in place" in n
               for n in r.to_json()["notes"])


def test_scan_layers_flops_are_layers_times_one_layer_unlike_xla():
    ov = {"layers": "4", "scan_layers": "true"}
    L, B, S, Hkv, D, c = cfg_of("gpt-tiny-prefill", ov)
    d, H, F = c["d_model"], c["heads"], 4 * c["d_model"]
    scanned = jaxmove.analyze("gpt-tiny-prefill", overrides=ov)
    unrolled = jaxmove.analyze("gpt-tiny-prefill", overrides={**ov, "scan_layers": "false"})
    whiles = [r for r in scanned.rows if r.instr.opcode == "while"]
    assert len(whiles) == 1
    body = whiles[0].instr.attrs["body"].lstrip("%")
    assert scanned.analysis.multiplicity[body].count == L
    layer_flops = sum(r.per_execution.flops for r in scanned.rows if r.computation == body)
    # one layer's matmuls in closed form: q/k/v/out projections, scores and PV, MLP
    matmul = (2 * B * S * d * (H + 2 * Hkv) * D + 2 * B * S * H * D * d
              + 2 * 2 * B * H * S * S * D + 2 * 2 * B * S * d * F)
    assert matmul <= layer_flops <= 1.1 * matmul          # + LayerNorm, GELU, softmax
    outside = scanned.totals.flops - L * layer_flops
    assert 0 <= outside < layer_flops
    # the same model without scan has (nearly) the same flops: the loop was counted L times
    assert abs(scanned.totals.flops - unrolled.totals.flops) <= 0.01 * unrolled.totals.flops
    # XLA's Compiled.cost_analysis() walks the loop body once: about one layer, not four.
    xla = scanned.xla_cost_analysis["flops"]
    assert abs(xla - (outside + layer_flops)) <= 0.02 * xla
    assert scanned.totals.flops > 3 * xla


def test_mlp_flops_closed_form_and_xla_agree_without_loops():
    r = jaxmove.analyze("mlp")
    c = models.build("mlp").config
    B, d, F, L = c["batch"], c["d_model"], c["d_ff"], c["layers"]
    matmul = L * (2 * B * d * F + 2 * B * F * d)
    assert matmul <= r.totals.flops <= 1.05 * matmul       # + bias adds and GELU
    xla = r.xla_cost_analysis["flops"]                       # no loops: XLA is right here
    assert abs(r.totals.flops - xla) <= 0.01 * xla


def test_json_contract_and_cli(capsys):
    assert main(["analyze", "gpt-tiny-decode", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"program", "totals", "by_path", "by_role", "instructions", "unmodeled"}
    assert set(out["program"]) >= {"name", "backend", "num_devices", "source"}
    assert set(out["totals"]) >= {"flops", "hbm_read_bytes", "hbm_write_bytes"}
    assert set(out["by_path"]) == {"host_to_device", "hbm_to_onchip", "onchip_to_hbm",
                                   "device_to_device", "device_to_host"}
    assert set(out["by_role"]) == {"weights", "kv_cache", "optimizer_state", "activations", "unknown"}
    row = out["instructions"][0]
    assert set(row) >= {"name", "computation", "opcode", "multiplicity", "flops", "hbm_read_bytes",
                        "hbm_write_bytes", "unmodeled"}
    # the totals are the sum of the rows (no conditionals here) and of the roles
    assert sum(i["hbm_read_bytes"] for i in out["instructions"]) == out["totals"]["hbm_read_bytes"]
    assert sum(v["read_bytes"] for v in out["by_role"].values()) == out["totals"]["hbm_read_bytes"]
    assert out["by_path"]["hbm_to_onchip"] == out["totals"]["hbm_read_bytes"]


def test_hlo_file_roles_from_names(tmp_path, capsys):
    hlo = tmp_path / "m.hlo"
    hlo.write_text("""HloModule m
ENTRY e {
  w = f32[64,64]{1,0} parameter(0), metadata={op_name="params['dense']['kernel']"}
  c = f32[4,64]{1,0} parameter(1), metadata={op_name="cache['k']"}
  x = f32[4,64]{1,0} parameter(2), metadata={op_name="x"}
  d = f32[4,64]{1,0} dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT a = f32[4,64]{1,0} add(d, c)
}
""")
    assert main(["analyze", str(hlo), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["by_role"]["weights"]["read_bytes"] == 64 * 64 * 4
    assert out["by_role"]["kv_cache"]["read_bytes"] == 4 * 64 * 4
    assert out["by_role"]["unknown"]["read_bytes"] == 4 * 64 * 4
    assert out["by_role"]["activations"] == {"read_bytes": 4 * 64 * 4, "write_bytes": 2 * 4 * 64 * 4}
    assert out["totals"]["flops"] == 2 * 4 * 64 * 64 + 4 * 64


_BAD_INPUTS = [
    (None, "no such file"),
    ("HloModule t\nENTRY e {\n  ROOT p = f32[8,128 parameter(0)\n", ":3:16: expected ']'"),
    ("HloModule t\nENTRY e {\n  p = f32[4] parameter(0)\n  ROOT a = f32[4] add(p, p", ":4:"),
]


@pytest.fixture(scope="module")
def bad_input_runs(tmp_path_factory):
    """{case index: (bad.hlo path, Future of the CompletedProcess of ``jaxmove analyze`` on it)}:
    the three processes (~1.5 s each, python and jaxmove's import) side by side, each on a
    file in a directory of its own."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=3, thread_name_prefix="test-analyze")
    runs = {}
    for i, (content, _) in enumerate(_BAD_INPUTS):
        path = tmp_path_factory.mktemp(f"bad_input_{i}") / "bad.hlo"
        if content is not None:
            path.write_text(content)
        runs[i] = path, pool.submit(subprocess.run, [sys.executable, "-m", "jaxmove.cli", "analyze", str(path)],
                                    capture_output=True, text=True)
    yield runs
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("case", range(len(_BAD_INPUTS)), ids=[f"{c}-{e}" for c, e in _BAD_INPUTS])
def test_cli_bad_input_exits_2_with_one_line(bad_input_runs, case):
    _content, expect = _BAD_INPUTS[case]
    path, run = bad_input_runs[case]
    proc = run.result()
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expect in lines[0] and "Traceback" not in proc.stderr
    assert str(path) in lines[0]


def test_cli_unknown_opcode_is_unmodeled_not_a_crash(tmp_path, capsys):
    path = tmp_path / "u.hlo"
    path.write_text("HloModule t\nENTRY e {\n  p = f32[4]{0} parameter(0)\n  ROOT q = f32[4]{0} frob(p)\n}\n")
    assert main(["analyze", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["unmodeled"] == ["q"]


def test_cli_bad_set_and_unknown_target(capsys):
    assert main(["analyze", "gpt-tiny-decode", "--set", "nonsense=1"]) == 2
    assert "nonsense" in capsys.readouterr().err
    assert main(["analyze", "no-such-preset"]) == 2
    assert "not a zoo preset" in capsys.readouterr().err


def test_gpt2_small_decode_runs(gpt2_small_decode):
    r = jaxmove.analyze(gpt2_small_decode)    # the program of "gpt2-small-decode" (conftest)
    # GPT-2 small: 124,439,808 bf16 parameters; the step reads at least all of them once.
    assert r.totals.weights_read_bytes >= 124_439_808 * 2 * 0.95
    assert r.program.backend == "cpu" and not r.unmodeled


def test_file_function_target_returning_a_workload(tmp_path, capsys):
    src = tmp_path / "my_workload.py"
    src.write_text('''
import jax, jax.numpy as jnp
from jaxmove.capture import Workload

def make():
    w = jax.ShapeDtypeStruct((512, 256), jnp.float32)
    x = jax.ShapeDtypeStruct((8, 512), jnp.float32)
    return Workload("proj", lambda w, x: x @ w, (w, x), ("weights", "activations"))
''')
    assert main(["analyze", f"{src}:make", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["by_role"]["weights"]["read_bytes"] == 512 * 256 * 4
    assert out["by_role"]["activations"]["read_bytes"] == 8 * 512 * 4
    assert out["totals"]["flops"] == 2 * 8 * 512 * 256
    assert main(["analyze", f"{src}:nothing"]) == 2


def test_excess_instructions_carry_the_source_lines_the_report_shows(gpt2_small_decode):
    """Every instruction an excess cause lists has the source line the report's instruction
    table gives it, inferred from its neighbours where its metadata has none (a user trial
    found 40 of 56 listed without one, e.g. the embedding's wrapped_convert)."""
    d = jaxmove.analyze(gpt2_small_decode).to_json()
    rows = {(r["computation"], r["name"]): r for r in d["instructions"]}
    items = [i for c in d["excess"]["causes"] for i in c["instructions"]]
    assert items and any(i["source_inferred"] for i in items)   # (some are inferred here)
    for i in items:
        row = rows[(i["computation"], i["name"])]
        assert i["source"] is not None and i["source"] == row["source"], i
        assert i["source_inferred"] == row["source_inferred"], i


def test_excess_tables_mark_inferred_source_lines(gpt2_small_decode):
    """The text and HTML cause tables prefix an inferred line with ``≈`` and a line from the
    instruction's own metadata with nothing (the instruction table's convention)."""
    from rich.console import Console
    from jaxmove.report.excess_html import excess_section
    from jaxmove.report.excess_table import SHOWN_INSTRUCTIONS, render_excess
    report = jaxmove.analyze(gpt2_small_decode)
    console = Console(record=True, width=400)
    render_excess(report, console)
    text = console.export_text()
    html = excess_section(report)
    shown = [i for c in report.excess.causes for i in c.instructions[:5] if i.source]  # (HTML: 5)
    assert any(i.source_inferred for i in shown) and any(not i.source_inferred for i in shown)
    for i in shown:
        mark = "≈ " if i.source_inferred else ""
        assert f'<span class="meta">{mark}{i.source}</span>' in html, i
    listed = [i for c in report.excess.causes for i in c.instructions[:SHOWN_INSTRUCTIONS] if i.source]
    assert any(i.source_inferred for i in listed) and any(not i.source_inferred for i in listed)
    for i in listed:
        mark = "≈ " if i.source_inferred else ""
        assert f"{i.name} @{mark}{i.source.rsplit('/', 1)[-1]}" in text, i
