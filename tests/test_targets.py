"""Compile targets (issue 11): programs compiled by XLA:TPU and XLA:GPU on a machine without the
device, checked against closed-form bytes and FLOPs computed here from the shapes.

Per target family: a decode step (weights + KV cache read once), a prefill MLP, a tensor-parallel
all-reduce, an FSDP all-gather and a scan over stacked weights. Each program is compiled once
per module. Tests skip with a message when the family's extra (libtpu / the CUDA plugin) is not
installed.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # never start an accelerator client here
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import importlib.util  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from jaxmove import analyze  # noqa: E402
from jaxmove.capture.program import CaptureError  # noqa: E402
from jaxmove.capture.targets import (DoesNotFitError, MissingExtraError, Target,  # noqa: E402
                                     TargetNameError, gpu_target_config)
from tests.conftest import cpu_devices_env  # noqa: E402

BF16 = 2  # bytes per bf16 element
D, S, B, T, F, L = 512, 1024, 8, 256, 1024, 4   # multiples of the TPU tiles: no padding

FAMILIES = {"tpu": ("tpu-v5e:2x2", "libtpu"), "gpu": ("h100-sxm:1x1x4", "jax_plugins.xla_cuda12")}


def _have(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _target_or_skip(family: str) -> Target:
    name, module = FAMILIES[family]
    if not _have(module):
        pytest.skip(f"{module} is not installed (pip install \"jaxmove[{family}]\")")
    return Target.parse(name)


def sds(shape, sharding=None, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding)


def decode(w, cache, x):
    return (x @ w) @ cache.T


def mlp(w1, w2, x):
    return jax.nn.relu(x @ w1) @ w2


def scan(ws, x):
    return jax.lax.scan(lambda c, w: (c @ w, None), x, ws)[0]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def programs(request):
    """The five programs of one family, compiled and analysed once."""
    t = _target_or_skip(request.param)
    mesh = t.mesh({"model": 4})
    rep = NamedSharding(mesh, P())
    col, row = NamedSharding(mesh, P(None, "model")), NamedSharding(mesh, P("model", None))

    def fsdp(w, x):
        return x @ jax.lax.with_sharding_constraint(w, rep)

    out = {
        "decode": analyze(decode, sds((D, D)), sds((S, D)), sds((B, D)),
                          roles=("weights", "kv_cache", "activations"), target=t.name),
        "prefill": analyze(mlp, sds((D, F)), sds((F, D)), sds((T, D)),
                           roles=("weights", "weights", "activations"), target=t.name),
        "tp": analyze(mlp, sds((D, F), col), sds((F, D), row), sds((T, D), rep),
                      roles=("weights", "weights", "activations"), target=t.name),
        "fsdp": analyze(fsdp, sds((D, F), row), sds((T, D), rep), roles=("weights", "activations"),
                        target=t.name),
        "scan": analyze(scan, sds((L, D, D)), sds((T, D)), roles=("weights", "activations"),
                        target=t.name),
    }
    return request.param, t, out


def _role(report, role):
    return dict(zip(("read", "write"), report.totals.role_bytes(role)))


def _collectives(report):
    return [r.collective for r in report.rows if r.collective is not None]


def test_programs_are_the_targets(programs):
    family, t, out = programs
    for name, r in out.items():
        assert r.program.backend == family, name
        assert not r.unmodeled, (name, [u.instr.name for u in r.unmodeled])
        assert _role(r, "unknown") == {"read": 0, "write": 0}, name
    assert any("compiled for " + t.name in n for n in out["decode"].notes)
    if family == "gpu":  # the GPU path says it did no autotuning
        assert any("no autotuning" in n for n in out["decode"].notes)


def test_decode_reads_weights_and_cache_once(programs):
    _, _, out = programs
    r = out["decode"]
    assert _role(r, "weights") == {"read": D * D * BF16, "write": 0}
    assert _role(r, "kv_cache") == {"read": S * D * BF16, "write": 0}
    want = 2 * B * D * D + 2 * B * D * S          # the two dots, 2 flops per multiply-add
    assert want <= r.totals.flops <= want * 1.01


def test_prefill_mlp(programs):
    _, _, out = programs
    r = out["prefill"]
    assert _role(r, "weights") == {"read": 2 * D * F * BF16, "write": 0}
    want = 2 * (2 * T * D * F)                      # two dots
    assert want <= r.totals.flops <= want * 1.01 + T * F  # + the relu


def test_tensor_parallel_all_reduce(programs):
    family, _, out = programs
    r = out["tp"]
    # each device holds a quarter of each weight and reads it once
    assert _role(r, "weights") == {"read": 2 * D * F * BF16 // 4, "write": 0}
    (c,) = [c for c in _collectives(r) if c.kind == "all-reduce"]
    assert c.group_size == 4
    assert c.buffer_bytes == T * D * BF16            # the device reduces in bf16 (XLA:CPU: f32)
    assert c.wire_bytes == 2 * 3 * T * D * BF16 // 4  # ring all-reduce: 2 (n-1)/n of the buffer
    assert c.is_async == (family == "gpu")           # XLA:GPU's all-reduce-start/-done
    want = 2 * (2 * T * D * F) // 4
    assert want <= r.totals.flops <= want * 1.01 + T * F


def test_fsdp_all_gather(programs):
    _, _, out = programs
    r = out["fsdp"]
    (c,) = [c for c in _collectives(r) if c.kind == "all-gather"]
    assert c.group_size == 4
    assert c.buffer_bytes == D * F * BF16            # the gathered weight
    assert c.wire_bytes == 3 * D * F * BF16 // 4      # ring all-gather: (n-1)/n of the result
    assert _role(r, "weights")["read"] >= D * F * BF16 // 4   # the local shard, at least
    want = 2 * T * D * F
    assert want <= r.totals.flops <= want * 1.01


def test_scan_counts_every_layer(programs):
    family, _, out = programs
    r = out["scan"]
    want = L * 2 * T * D * D
    assert want <= r.totals.flops <= want * 1.01
    w = _role(r, "weights")
    if family == "tpu":
        assert w == {"read": L * D * D * BF16, "write": 0}
    else:  # XLA:GPU copies the stacked weights into the loop state once: read twice, written once
        assert w["read"] >= L * D * D * BF16
    assert max(row.multiplicity.count for row in r.rows) >= L


# ---- names, topologies, meshes ------------------------------------------------------------

def test_target_names():
    assert Target.parse(None).name == "cpu" and Target.parse("cpu").platform == "cpu"
    h = Target.parse("h100-sxm")
    assert (h.name, h.platform, h.num_devices) == ("h100-sxm:1x1x8", "gpu", 8)
    assert Target.parse("h100-sxm:1x2x8").num_devices == 16
    assert Target.parse("tpu-v5e").name == "tpu-v5e:2x2"
    assert Target.parse("tpu-v5e:4x4").num_devices == 16
    assert Target.parse("tpu-v5p:4x4x4").num_devices == 64
    assert Target.parse("tpu-v4:2x2x1").num_devices == 8      # libtpu: one device per TensorCore
    assert Target.parse("tpu-v5e:2x4").default_mesh() == {"data": 2, "model": 4}
    assert Target.parse("h100-sxm:1x2x8").default_mesh() == {"data": 2, "model": 8}
    for bad in ("h100", "tpu-v5e:2x2x2", "h100-sxm:8", "tpu-v5e:2xa", "cpu-generic:2", "h100-sxm:0x1x8"):
        with pytest.raises(TargetNameError):
            Target.parse(bad)


def test_gpus_per_host_at_most_the_specs_node():
    """h100-sxm:1x1x16 (16 GPUs on one host) was accepted and its collectives timed as one
    8-GPU node's (the spec's devices_per_node); a host holds at most that many."""
    with pytest.raises(TargetNameError, match=r"a h100-sxm host holds 8 GPUs .* not 16; .* h100-sxm:1x2x8"):
        Target.parse("h100-sxm:1x1x16")
    with pytest.raises(TargetNameError, match=r"holds 8 GPUs .* not 12"):
        Target.parse("h100-sxm:1x1x12")
    assert Target.parse("h100-sxm:1x1x4").num_devices == 4    # part of a node
    assert Target.parse("b200:1x4x8").num_devices == 32


def test_v5e_slices_larger_than_the_compiler_takes_are_refused_before_libtpu_aborts(capsys):
    """XLA:TPU (libtpu 0.0.42) builds a v5e:16x32 topology's devices, then aborts the process
    while compiling for it ('Check failed: Topology()->chip_bounds().y <= 16'): no error to
    catch, exit 134 and nothing said. ``--target`` refuses it first, with one line, exit 2;
    v5e:16x16, the largest v5e slice (Google's docs: a pod of 256 chips), is a target."""
    assert Target.parse("tpu-v5e:16x16").num_devices == 256
    for bad in ("tpu-v5e:16x32", "tpu-v5e:32x1", "tpu-v5e:64x64", "tpu-v5e:17x2"):
        with pytest.raises(TargetNameError, match=r"at most 16 chips along each dimension"):
            Target.parse(bad)
    from jaxmove.cli import main
    assert main(["analyze", "gpt-tiny-decode", "--target", "tpu-v5e:16x32"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("jaxmove: error: --target 'tpu-v5e:16x32'") and "\n" not in err


def test_mesh_larger_than_topology_names_both():
    _target_or_skip("tpu")
    with pytest.raises(TargetNameError, match=r"data=16 needs 16 devices but --target tpu-v5e:2x2 has 4"):
        Target.parse("tpu-v5e:2x2").mesh({"data": 16})


def test_topology_device_counts():
    if _have("libtpu"):
        assert len(Target.parse("tpu-v5e:2x4").devices()) == 8
        assert len(Target.parse("tpu-v5e:1x1").devices()) == 1   # one chip of a 2x2
    if _have("jax_plugins.xla_cuda12"):
        devs = Target.parse("h100-sxm:1x2x8").devices()
        assert len(devs) == 16 and devs[0].device_kind == "NVIDIA H100 80GB HBM3"


def test_gpu_target_config_from_the_spec():
    from jaxmove.hardware import load_spec

    text = gpu_target_config(load_spec("h100-sxm"))
    # numbers of XLA's xla/backends/gpu/target_config/specs/h100_sxm.txtpb (openxla/xla)
    for field in ("core_count: 132", "threads_per_warp: 32", "shared_memory_per_core: 233472",
                  "shared_memory_per_block_optin: 232448", "l2_cache_size: 52428800",
                  "clock_rate_ghz: 1.98", "major: 9 minor: 0", 'platform_name: "CUDA"',
                  'device_description_str: "NVIDIA H100 80GB HBM3"'):
        assert field in text, field
    assert "core_count: 108" in gpu_target_config(load_spec("a100-80gb"))
    assert "major: 10 minor: 0" in gpu_target_config(load_spec("b200"))


def test_missing_extra_is_one_line_with_the_pip_command(monkeypatch):
    import jaxmove.capture.targets as targets

    real = importlib.util.find_spec
    monkeypatch.setattr(targets.importlib.util, "find_spec",
                        lambda name, *a: None if name == "libtpu" else real(name, *a))
    monkeypatch.setattr(targets, "_DEVICES", {})
    with pytest.raises(MissingExtraError, match=r'pip install "jaxmove\[tpu\]"'):
        Target.parse("tpu-v5e:2x2").devices()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_hlo_backend_is_inferred(family):
    from jaxmove.capture import capture
    from jaxmove.capture.program import infer_backend

    t = _target_or_skip(family)
    text = capture(decode, sds((D, D)), sds((S, D)), sds((B, D)), target=t.name).hlo_text
    assert infer_backend(text) == family
    assert infer_backend(capture(decode, sds((D, D)), sds((S, D)), sds((B, D))).hlo_text) == "cpu"


def test_backend_literals_only_skip_texts_the_marks_cannot_match():
    """infer_backend skips a backend's regex where none of its literal strings is in the text
    (_MARK_LITERALS): every text of the HLO corpus gets the regex-only answer, and so does each
    mark written alone (a literal missing from the list would turn one of them to 'unknown')."""
    import re
    from pathlib import Path
    from jaxmove.capture.program import _BACKEND_MARKS, infer_backend

    def regex_only(text):
        return next((b for b, mark in _BACKEND_MARKS if mark.search(text)), "unknown")
    samples = ['%a = f32[8,128]{1,0:T(8,128)} p', "x{0:S(1)}", '"estimated_cycles":"5"',
               'custom_call_target="tpu_custom_call"', '"operation_queue_id":"0"',
               '"fusion_backend_config":{}', 'custom_call_target="__cublas$gemm"',
               '"kind":"__triton_gemm"', '"outer_dimension_partitions":[]', '"kind":"__onednn$x"',
               'custom_call_target="xla.cpu.foo"', 'custom_call_target="__ynn_x"', "no marks at all"]
    corpus = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "hlo"
    texts = samples + [p.read_text(errors="replace") for p in sorted(corpus.glob("*.hlo"))]
    for text in texts:
        assert infer_backend(text) == regex_only(text), text[:80]
    assert [infer_backend(t) for t in samples[:4]] == ["tpu"] * 4
    assert re.fullmatch(r"(gpu ){4}(cpu ){4}unknown ", "".join(infer_backend(t) + " " for t in samples[4:]))


def test_out_of_memory_is_an_answer():
    t = _target_or_skip("tpu")
    big = sds((1 << 16, 1 << 16), dtype=jnp.float32)      # 16 GiB per operand, v5e has 16 GB
    with pytest.raises(DoesNotFitError) as e:
        analyze(lambda x: (x @ x) + 1, big, target=t.name)
    assert e.value.needs_bytes > e.value.has_bytes > 0
    assert "does not fit on tpu-v5e:2x2: needs" in str(e.value)


def _cli(*argv, cwd=None):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-m", "jaxmove.cli", *argv], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=600)


_USER = '''
import jax, jax.numpy as jnp
from jaxmove.workload import Workload

def big():
    """A matmul whose operands do not fit one v5e chip's HBM unless sharded."""
    n = 1 << 16
    x = jax.ShapeDtypeStruct((n, n), jnp.float32)
    return Workload("big", lambda w, x: (x @ w) + 1, (x, x), ("weights", "activations"),
                    logical_axes=(("embed", "mlp"), ("batch", "embed")))
'''


def _sharded_cli(cwd: Path, kind: str):
    env = cpu_devices_env(4, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-m", "jaxmove.cli", "analyze", f"shardmod:{kind}", "--json"],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=600)


def _cli_runs_of(item) -> dict:
    """{name: function of a scratch directory that runs the process} for one selected test."""
    name = item.originalname
    if name == "test_cli_out_of_memory" and _have(FAMILIES["tpu"][1]):
        def in_dir(d: Path) -> Path:
            (d / "usermod.py").write_text(_USER)
            return d
        return {"oom_analyze": lambda d: _cli("analyze", "usermod:big", "--target", "tpu-v5e:2x2",
                                              cwd=in_dir(d / "oom_analyze")),
                "oom_plans": lambda d: _cli("plans", "usermod:big", "--target", "tpu-v5e:2x2", "--plan", "dp",
                                            "--json", "--no-progress", cwd=in_dir(d / "oom_plans"))}
    if name == "test_sharded_lowered_and_compiled_use_shard_shapes":
        kind = item.callspec.params["kind"]

        def run(d: Path, kind=kind):
            (d / f"sharded_{kind}" / "shardmod.py").write_text(_SHARDED)
            return _sharded_cli(d / f"sharded_{kind}", kind)
        return {f"sharded_{kind}": run}
    if name == "test_annotate_takes_mesh_and_plan":
        return {"annotate": lambda d: _cli("annotate", "mlp-tiny", "--mesh", "data=2", "--plan", "dp")}
    return {}


@pytest.fixture(scope="module")
def cli_runs(request, tmp_path_factory):
    """{name: Future of the CompletedProcess} of this module's CLI processes (python, jax and a
    compile: 1.5 to 2.5 s each) for the tests selected, all started when the first is needed,
    two at a time: each is a process of its own in a directory of its own, so running them
    side by side changes nothing they compute (11 s one after the other, ~6.5 s so)."""
    from concurrent.futures import ThreadPoolExecutor

    runs = {}
    for item in request.session.items:
        if item.module is request.module:
            runs.update(_cli_runs_of(item))
    tmp = tmp_path_factory.mktemp("targets_cli")
    for name in runs:
        (tmp / name).mkdir()
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="test-targets")
    futures = {name: pool.submit(run, tmp) for name, run in runs.items()}
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


def test_cli_out_of_memory(cli_runs):
    _target_or_skip("tpu")
    p = cli_runs["oom_analyze"].result()          # _USER's big() as usermod.py in the cwd
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "does not fit on tpu-v5e:2x2: needs" in lines[0], p.stderr
    # plans: a plan that does not fit is a result (NO), exit 0; the user's own workload works
    p = cli_runs["oom_plans"].result()
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["target"] == "tpu-v5e:2x2" and out["mesh"] == {"data": 2, "model": 2}
    (dp,) = out["plans"]
    assert dp["fits"] is False and dp["needs_bytes"] > dp["has_bytes"] and dp["error"] is None
    assert "TPU_ACCELERATOR_TYPE" not in p.stderr and "cuda" not in p.stderr.lower()


# ---- issue 16 item 1: a user's own sharded programs -----------------------------------------

_SHARDED = '''
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

def _jit():
    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
    s = NamedSharding(mesh, P("x", None))
    x = jax.ShapeDtypeStruct((64, 1024), jnp.float32)
    return jax.jit(lambda x: jnp.tanh(x) * 2, in_shardings=s, out_shardings=s), x

def lowered():
    f, x = _jit()
    return f.lower(x)

def compiled():
    f, x = _jit()
    return f.lower(x).compile()
'''


@pytest.mark.parametrize("kind", ["lowered", "compiled"])
def test_sharded_lowered_and_compiled_use_shard_shapes(cli_runs, kind):
    p = cli_runs[f"sharded_{kind}"].result()      # _SHARDED as shardmod.py in the cwd
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    (param,) = out["parameters"]
    assert param["shape"] == "f32[16,1024]" and param["byte_size"] == 16 * 1024 * 4  # a quarter
    assert out["program"]["num_devices"] == 4


def test_annotate_takes_mesh_and_plan(cli_runs):
    p = cli_runs["annotate"].result()
    assert p.returncode == 0, p.stderr
    assert "HloModule" in p.stdout and "jaxmove: error" not in p.stderr


def test_costed_on_another_chip_than_compiled_for_says_so():
    """--target tpu-v5e:1x1 --hardware tpu-v5p: the headline is tpu-v5p's, the program v5e's
    compiler's; a note says so (it did for CPU programs on a GPU spec, not for two TPUs)."""
    import importlib.util

    import jaxmove
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed (the tpu extra)")
    rep = jaxmove.analyze("mlp-tiny", target="tpu-v5e:1x1", hardware="tpu-v5p")
    assert any("compiled for tpu-v5e:1x1 (tpu-v5e) and costed on tpu-v5p, another chip" in n for n in rep.notes)
    assert not any("another chip" in n for n in jaxmove.analyze("mlp-tiny", target="tpu-v5e:1x1").notes)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_arguments_sharded_over_cpu_devices_are_refused_for_an_accelerator_target(family):
    """jit compiles for the devices its arguments are sharded over: a function whose arguments
    carry CPU shardings was compiled by XLA:CPU and labelled with the target (a user trial: an
    f32 all-reduce of XLA:CPU's reported as the TPU program's). Refused, naming the leaf."""
    t = _target_or_skip(family)
    cpu_mesh = jax.sharding.Mesh(jax.devices("cpu")[:1], ("x",))
    x = jax.ShapeDtypeStruct((64, 128), jnp.bfloat16, sharding=NamedSharding(cpu_mesh, P("x")))
    with pytest.raises(CaptureError, match=rf"--target {t.name}: argument leaf 0 is sharded over cpu "
                                           r"devices.*Target.parse"):
        analyze(lambda a: a * 2, x, target=t.name)
    with pytest.raises(CaptureError, match=r"in_shardings entry 1 is sharded over cpu devices"):
        plain = jax.ShapeDtypeStruct((64, 128), jnp.bfloat16)
        analyze(lambda a, b: a * b, plain, plain, in_shardings=(None, NamedSharding(cpu_mesh, P())),
                target=t.name)
    # an uncommitted array (jnp.ones: nobody placed it) goes where jit puts it: the target
    assert analyze(lambda a: a * 2, jnp.ones((64, 128), jnp.bfloat16), target=t.name).program.backend == family
    # over the target's own compile-only devices: compiled by the target's compiler
    on_target = NamedSharding(t.mesh({"x": 1}), P("x"))
    rep = analyze(lambda a: a * 2, jax.ShapeDtypeStruct((64, 128), jnp.bfloat16, sharding=on_target),
                  target=t.name)
    assert rep.program.backend == family
