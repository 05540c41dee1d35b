"""Output roles (``Workload.out_roles`` -> ``Program.output_roles`` -> the roles pass): the values
an output is made of take its role, so the KV cache a prefill returns is written as
``kv_cache``, not ``activations``; the compulsory total does not change, only its roles."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import jaxmove
from jaxmove import zoo as models
from jaxmove.capture.workload import Workload, flatten_out_roles
from jaxmove.errors import JaxmoveInputError
from jaxmove.hlo import parse_module
from jaxmove.passes.pipeline import run_pipeline
from jaxmove.passes.roles import roles_pass

# A prefill-like ENTRY: the cache is the dot's result, returned through a bitcast; the logits
# are an add. Hand-written: 2 outputs, leaves 0 (logits) and 1 (cache).
_HLO = """HloModule m, entry_computation_layout={(f32[4,8]{1,0}, f32[8,8]{1,0})->(f32[4,8]{1,0}, f32[32]{0})}

ENTRY e {
  x = f32[4,8]{1,0} parameter(0)
  w = f32[8,8]{1,0} parameter(1)
  k = f32[4,8]{1,0} dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  kb = f32[32]{0} bitcast(k)
  logits = f32[4,8]{1,0} add(x, k)
  ROOT t = (f32[4,8]{1,0}, f32[32]{0}) tuple(logits, kb)
}
"""


def test_output_role_reaches_the_values_the_output_is_made_of():
    mod = parse_module(_HLO)
    plain = roles_pass(mod, {0: "activations", 1: "weights"})
    assert plain[("e", "k")] == ("activations",) and plain[("e", "kb")] == ("activations",)
    seeded = roles_pass(mod, {0: "activations", 1: "weights"}, output_roles=(None, "kv_cache"))
    assert seeded[("e", "kb")] == ("kv_cache",)
    assert seeded[("e", "k")] == ("kv_cache",)          # (walked back through the bitcast)
    assert seeded[("e", "logits")] == ("activations",)  # (an output given no role keeps its own)
    assert seeded[("e", "t")] == ("activations", "kv_cache")
    # a length that is not the root's leaf count is ignored, never guessed from
    wrong = roles_pass(mod, {0: "activations", 1: "weights"}, output_roles=("kv_cache",))
    assert wrong[("e", "k")] == ("activations",)


def test_output_roles_move_bytes_between_roles_not_the_total():
    mod = parse_module(_HLO)
    entry_roles = {0: "activations", 1: "weights"}
    a = run_pipeline(mod, entry_roles)
    b = run_pipeline(parse_module(_HLO), entry_roles, output_roles=(None, "kv_cache"))
    # the dot writes k (4 x 8 f32 = 128 B): now as kv_cache
    assert b.analysis.totals.kv_cache_write_bytes == 4 * 8 * 4
    assert a.analysis.totals.kv_cache_write_bytes == 0
    assert a.analysis.totals.hbm_write_bytes == b.analysis.totals.hbm_write_bytes
    assert a.excess.compulsory_bytes == b.excess.compulsory_bytes
    assert b.excess.by_role["kv_cache"].compulsory_bytes == 4 * 8 * 4


def test_flatten_out_roles_prefixes_and_errors():
    out = (jnp.zeros(2), {"k": jnp.zeros(3), "v": jnp.zeros(3)})
    tree = jax.tree_util.tree_structure(out)
    assert flatten_out_roles(("activations", "kv_cache"), tree, 3) == ["activations", "kv_cache", "kv_cache"]
    assert flatten_out_roles("weights", tree, 3) == ["weights"] * 3
    assert flatten_out_roles(None, tree, 3) == [None] * 3
    assert flatten_out_roles((None, {"k": "kv_cache", "v": None}), tree, 3) == [None, "kv_cache", None]
    from jaxmove.errors import JaxmoveInputError
    with pytest.raises(JaxmoveInputError, match="expected one of"):
        flatten_out_roles(("activations", "kv-cache"), tree, 3)
    with pytest.raises(JaxmoveInputError, match="expected one of"):
        flatten_out_roles(("activations", 3), tree, 3)
    with pytest.raises(JaxmoveInputError, match="is not a prefix of the structure"):
        flatten_out_roles(("activations", "kv_cache", "weights"), tree, 3)
    # a tuple for a dict output is not matched to its (sorted) keys by position: an error
    d = jax.tree_util.tree_structure({"logits": jnp.zeros(2), "cache": jnp.zeros(3)})
    with pytest.raises(JaxmoveInputError, match="is not a prefix of the structure"):
        flatten_out_roles(("activations", "kv_cache"), d, 2)
    assert flatten_out_roles({"logits": "activations", "cache": "kv_cache"}, d, 2) == ["kv_cache", "activations"]


def test_bad_out_roles_are_bad_input_on_the_cli(tmp_path, capsys, monkeypatch):
    """A Workload's bad out_roles is the user's input: one line, exit 2 (not an internal error)."""
    from jaxmove.cli import main
    (tmp_path / "wl_bad.py").write_text(
        "import jax, jax.numpy as jnp\n"
        "from jaxmove import Workload\n"
        "def make():\n"
        "    return Workload(name='step', fn=lambda x: {'logits': x, 'cache': x * 2},\n"
        "                    args=(jax.ShapeDtypeStruct((4,), jnp.float32),), roles=('activations',),\n"
        "                    out_roles=('activations', 'kv_cache'))\n")
    monkeypatch.chdir(tmp_path)
    assert main(["analyze", "wl_bad:make"]) == 2
    err = capsys.readouterr().err
    assert "step: out_roles" in err and "not a prefix" in err and "internal error" not in err


def test_bad_out_roles_fail_before_the_compile(monkeypatch):
    from jaxmove.capture import compile_cache
    from jaxmove.capture.program import capture

    def no_compile(*a, **k):
        raise AssertionError("compiled before out_roles were checked")

    monkeypatch.setattr(compile_cache, "cached_compile", no_compile)
    wl = Workload(name="bad", fn=lambda x: (x, x), args=(jax.ShapeDtypeStruct((4,), jnp.float32),),
                  roles=("activations",), out_roles=("activations", "cache"))
    with pytest.raises(ValueError, match="bad: out_roles has 'cache'"):
        capture(wl)


def _kv_closed_form(preset, overrides):
    c = models.build(preset, overrides).config
    L, B, S, Hkv, D = c["layers"], c["batch"], c["seq_len"], c["kv_heads"], c["d_model"] // c["heads"]
    return 2 * L * B * S * Hkv * D * 4  # K and V, f32


def test_prefill_writes_its_cache_as_kv_cache_on_xla_cpu():
    ov = {"layers": "3"}
    kv = _kv_closed_form("gpt-tiny-prefill", ov)
    prog = jaxmove.resolve_program("gpt-tiny-prefill", overrides=ov)
    assert prog.output_roles[0] == "activations" and set(prog.output_roles[1:]) == {"kv_cache"}
    assert len(prog.output_roles) == 1 + 2 * 3
    r = jaxmove.analyze(prog)
    assert r.excess.by_role["kv_cache"].compulsory_bytes == kv       # the cache, written once
    assert r.totals.kv_cache_write_bytes >= kv
    assert r.totals.kv_cache_read_bytes < r.totals.kv_cache_write_bytes
    # a cache the program makes is not one it rewrites instead of updating: no KV notes
    assert not [n for n in r.to_json()["notes"] if "KV-cache" in n or "KV cache" in n]
    # --json says which roles the outputs were given
    assert r.to_json()["program"]["output_roles"] == list(prog.output_roles)
    # the same module without the output roles: the same compulsory total, all of it elsewhere
    import dataclasses
    bare = jaxmove.analyze(dataclasses.replace(prog, output_roles=()))
    assert bare.excess.compulsory_bytes == r.excess.compulsory_bytes
    assert bare.excess.by_role["kv_cache"].compulsory_bytes == 0
    assert bare.totals.hbm_write_bytes == r.totals.hbm_write_bytes


@pytest.mark.parametrize("target", ["tpu-v5e", "h100-sxm"])
def test_prefill_writes_its_cache_as_kv_cache_on_accelerators(target):
    """The accelerators' own programs (compiled without the device): XLA:TPU pads the cache's
    16-wide minor dimension to its 128-lane tiles, XLA:GPU writes it as the K/V projections'
    fusions; either way the compulsory KV bytes are the cache, once."""
    kv = _kv_closed_form("gpt-tiny-prefill", {})
    r = jaxmove.analyze("gpt-tiny-prefill", target=target)
    assert r.excess.by_role["kv_cache"].compulsory_bytes == kv
    assert r.totals.kv_cache_write_bytes >= kv
    assert not [n for n in r.to_json()["notes"] if "KV-cache" in n or "KV cache" in n]


@pytest.mark.parametrize("scan", ["false", "true"])
def test_reduced_llama_prefill_against_closed_forms(scan):
    """Reduced copy of benchmarks/excess_closed_forms.py's ``pre`` case (Llama-3-8B prefill,
    checked there at full size on h100-sxm and tpu-v5p): every parameter read once but the
    embedding (the B S rows the tokens gather), the returned cache written once as kv_cache,
    the tokens read and the last position's logits written."""
    L, D, H, HKV, F, V, S, B = 2, 256, 4, 2, 512, 1024, 128, 2
    HD, BF16 = D // H, 2
    sets = dict(layers=L, d_model=D, heads=H, kv_heads=HKV, d_ff=F, vocab=V, seq_len=S, batch=B)
    r = jaxmove.analyze("llama3-8b-prefill", overrides={**{k: str(v) for k, v in sets.items()},
                                                       "scan_layers": scan})
    by_role = r.excess.by_role
    weights = (L * (D * H * HD + 2 * D * HKV * HD + H * HD * D + 3 * D * F + 2 * D)
               + V * D + D + B * S * D) * BF16
    assert by_role["weights"].compulsory_bytes == weights
    assert by_role["kv_cache"].compulsory_bytes == 2 * L * B * HKV * HD * S * BF16
    assert by_role["activations"].compulsory_bytes == B * S * 4 + B * V * 4


@pytest.mark.parametrize("target,plan,mesh", [("h100-sxm:1x1x4", "tp", {"model": 4}),
                                              ("tpu-v5e:2x2", "fsdp", {"data": 4})])
def test_prefill_cache_per_device_under_a_plan(target, plan, mesh):
    """Under a sharding plan the output roles still reach the cache: each of 4 devices writes
    its quarter (tp: 4 kv heads over model = 4; fsdp: batch 8 over data = 4)."""
    from jaxmove.plans import capture_with_plan, load_plan
    L, D, H, HKV, S, B = 2, 256, 4, 4, 128, 8
    sets = dict(layers=L, d_model=D, heads=H, kv_heads=HKV, d_ff=512, vocab=1024, seq_len=S, batch=B)
    prog = capture_with_plan("llama3-8b-prefill", {k: str(v) for k, v in sets.items()}, load_plan(plan),
                             mesh, [], target=target)
    assert prog.output_roles == ("activations",) + ("kv_cache",) * (2 * L)
    r = jaxmove.analyze(prog, hardware=target.split(":")[0])
    assert r.excess.by_role["kv_cache"].compulsory_bytes == 2 * L * B * HKV * (D // H) * S * 2 // 4


def test_reduced_gemma2_and_deepseek_prefill_caches_against_closed_forms():
    """Reduced copies of the benchmark's g2pre and dspre cases: the cache a prefill returns,
    written once as kv_cache. Gemma 2's local (even) layers keep a ring of their window, the
    global ones every position; DeepSeek-V3's MLA keeps one latent cache [B, S, r + dr] per
    layer."""
    L, S, B, W, HKV, HD = 2, 128, 2, 64, 2, 32
    g2 = jaxmove.analyze("gemma2-9b-prefill", overrides={k: str(v) for k, v in dict(
        layers=L, d_model=128, heads=4, kv_heads=HKV, head_dim=HD, seq_len=S, batch=B,
        sliding_window=W, vocab=512, d_ff=256).items()})
    assert g2.excess.by_role["kv_cache"].compulsory_bytes == 2 * B * HKV * HD * 2 * (W + S)
    ds_sets = {"layers": "2", "dense_layers": "1", "d_model": "256", "d_ff": "256", "expert_d_ff": "128",
               "vocab": "1024", "experts": "8", "top_k": "2", "heads": "16", "seq_len": "128", "batch": "2"}
    ds = jaxmove.analyze("deepseek-v3-prefill", overrides=ds_sets)
    c = models.build("deepseek-v3-prefill", ds_sets).config
    assert ds.excess.by_role["kv_cache"].compulsory_bytes == (
        c["layers"] * c["batch"] * c["seq_len"] * (c["kv_lora_rank"] + c["qk_rope_dim"]) * 2)


def test_leaf_index_inverts_leaf_position():
    """The root's flat leaf j -> its ShapeIndex (how output roles find an output), across nested
    tuples and empty tuple elements, checked against leaf_position."""
    from jaxmove.passes.roles import _leaf_index, leaf_position
    text = ("HloModule m\n\nENTRY e {\n"
            "  ROOT p = ((f32[2], ()), f32[3], (), (s32[], (f32[1], f32[1]))) parameter(0)\n}\n")
    shape = parse_module(text).entry.root.shape
    assert shape.num_leaves == 5
    got = [_leaf_index(shape, j) for j in range(shape.num_leaves)]
    assert got == [(0, 0), (1,), (3, 0), (3, 1, 0), (3, 1, 1)]
    assert [leaf_position(shape, i) for i in got] == list(range(5))


def test_plans_give_hbm_bytes_by_role_per_device():
    """``jaxmove plans --json`` rows carry hbm_bytes_by_role (as sweep rows do): per device, the
    roles sum to hbm_bytes, and a prefill's cache writes are kv_cache (at least the device's share
    of the cache: 4 kv heads over model = 4)."""
    from jaxmove.plans import compare_plans
    sets = {"layers": "2", "d_model": "256", "heads": "4", "kv_heads": "4", "d_ff": "512",
            "vocab": "1024", "seq_len": "128", "batch": "8"}
    cmp = compare_plans("llama3-8b-prefill", {"model": 4}, ["tp"], overrides=sets, target="h100-sxm:1x1x4",
                        jobs=1)
    (res,) = cmp.results
    by_role = cmp.to_json()["plans"][0]["hbm_bytes_by_role"]
    assert set(by_role) == {"weights", "kv_cache", "optimizer_state", "activations", "unknown"}
    assert sum(by_role.values()) == res.hbm_bytes
    assert by_role["kv_cache"] >= 2 * 2 * 8 * 4 * 64 * 128 * 2 // 4


def test_callable_takes_out_roles():
    """``jaxmove.analyze(f, *args, out_roles=...)``: a callable's outputs get roles as a
    Workload's do (it was a TypeError: only a Workload could give them)."""
    import jax
    import jax.numpy as jnp

    def prefill(w, x):
        h = x @ w
        return jnp.tanh(h), jnp.stack([h, h])   # (logits, a cache of two [8, 256] f32 blocks)

    w = jax.ShapeDtypeStruct((256, 256), jnp.float32)
    x = jax.ShapeDtypeStruct((8, 256), jnp.float32)
    rep = jaxmove.analyze(prefill, w, x, roles=("weights", "activations"),
                          out_roles=("activations", "kv_cache"))
    assert rep.program.output_roles[1] == "kv_cache"
    # the cache written once: 2 x 8 x 256 x 4 B; nothing else is KV
    assert rep.excess.by_role["kv_cache"].compulsory_bytes == 2 * 8 * 256 * 4
    with pytest.raises(JaxmoveInputError, match="kv_cachee"):
        jaxmove.analyze(prefill, w, x, out_roles=("activations", "kv_cachee"))
