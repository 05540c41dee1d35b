"""ICI wraparound per slice shape and TPU generation (issue 26): which torus axes are rings."""

from __future__ import annotations

import pytest

from jaxmove.hardware import load_spec
from jaxmove.hardware.overrides import with_slice_topology
from jaxmove.hlo import parse_module
from jaxmove.passes.collectives import collective_info, collective_time_s, has_wraparound, ici_links


def _all_gather(groups: str, n_devices: int, rows: int = 512, cols: int = 8192, k: int = 4) -> str:
    return f"""HloModule m, is_scheduled=true, num_partitions={n_devices}

ENTRY %e (x: bf16[{rows},{cols}]) -> bf16[{rows * k},{cols}] {{
  %x = bf16[{rows},{cols}] parameter(0)
  ROOT %ag = bf16[{rows * k},{cols}] all-gather(%x), channel_id=1, replica_groups={groups}, dimensions={{0}}, use_global_device_ids=true
}}
"""


def _info(text):
    m = parse_module(text)
    return collective_info(m.entry.by_name["ag"], m.entry, m)


def test_scaling_book_all_gather_over_y4_of_a_v5e_8x4_mesh():
    # jax-ml/scaling-book "sharding", pop quiz 2: AllGather_Y([E_Y, F]) -> [E, F], E = 2048,
    # F = 8192, bf16, mesh {X: 8, Y: 4} on TPU v5e: measured 680 us. A v5e axis has its
    # wraparound only at 16 chips, so the 4-chip groups are lines: 3/4 of 32 MiB over one
    # link's 4.5e10 B/s one way (the book's table) = 559 us, + 3 hops x 1 us
    spec = with_slice_topology(load_spec("tpu-v5e"), (8, 4))
    v = 2048 * 8192 * 2
    for groups in ("[8,4]<=[32]", "[8,4]<=[4,8]T(1,0)"):  # Y along x, or along y
        info = _info(_all_gather(groups, 32))
        assert ici_links(info, spec)[0] == 1
        t = collective_time_s(info, spec)
        assert t == pytest.approx(3 * v / 4 / 45e9 + 3 * 1e-6)
        assert abs(t / 680e-6 - 1) <= 0.20
    # without the slice shape a group is taken to be a ring (2 links): half that, 0.41 x 680 us
    info = _info(_all_gather("[8,4]<=[32]", 32))
    assert collective_time_s(info, load_spec("tpu-v5e")) == pytest.approx(3 * v / 4 / 90e9 + 3e-6)


def test_wraparound_per_generation():
    # v5e / v6e: a dimension is a ring only when it is a full 16 (no optical switches)
    assert has_wraparound((16, 16), 0, "v5e") and has_wraparound((8, 16), 1, "v6e")
    assert not has_wraparound((8, 16), 0, "v6e") and not has_wraparound((4, 4), 0, "v5e")
    # v4 / v5p: optical switches give every dimension its wraparound in whole 4x4x4 cubes only
    assert has_wraparound((4, 4, 4), 2, "v5p") and has_wraparound((4, 4, 8), 0, "v4")
    assert not has_wraparound((2, 2, 4), 2, "v5p") and not has_wraparound((2, 2, 1), 0, "v4")


def test_links_per_group_shape():
    # a full 16-chip axis of a v5e 16x16 slice: a ring, 2 links; both axes: 4 links
    spec = with_slice_topology(load_spec("tpu-v5e"), (16, 16))
    row = _info(_all_gather("[16,16]<=[256]", 256, k=16))
    assert ici_links(row, spec)[0] == 2
    everything = _info(_all_gather("[1,256]<=[256]", 256, rows=32, k=256))
    assert ici_links(everything, spec)[0] == 4
    # half an axis (8 of 16 chips) has no ring even on a 16-wide slice
    half = _info(_all_gather("[32,8]<=[256]", 256, k=8))
    assert ici_links(half, spec)[0] == 1
    # v5p 4x4x4 (a full cube): a 4-chip axis is a ring
    v5p = with_slice_topology(load_spec("tpu-v5p"), (4, 4, 4))
    assert ici_links(_info(_all_gather("[16,4]<=[64]", 64)), v5p)[0] == 2
    v5p_small = with_slice_topology(load_spec("tpu-v5p"), (2, 2, 4))
    assert ici_links(_info(_all_gather("[4,4]<=[4,4]T(1,0)", 16)), v5p_small)[0] == 1


def test_slice_topology_only_on_tpu_specs():
    h100 = load_spec("h100-sxm")
    assert with_slice_topology(h100, (1, 1, 8)) is h100
    v5e = load_spec("tpu-v5e")
    assert with_slice_topology(v5e, ()) is v5e
    assert with_slice_topology(v5e, (2, 2)).ici_topology == (2, 2)


def test_a_group_on_one_v4_chip_uses_no_ici_link():
    # a user trial: tpu-v4:2x2x1 --plan tp made groups of devices {0, 1}, the two TensorCores
    # of one chip; with no torus axis spanned the time fell back to a 2-link ring (19.48 us for
    # 1.5 MiB) though no ICI link carries it. Now: no link, and the time unmodeled (said so)
    from jaxmove.errors import Unmodeled

    spec = with_slice_topology(load_spec("tpu-v4"), (2, 2, 1))
    pairs = _info(_all_gather("[4,2]<=[8]", 8, k=2))
    assert ici_links(pairs, spec)[0] == 0
    with pytest.raises(Unmodeled, match="one chip"):
        collective_time_s(pairs, spec)
    # devices {0, 2}: two chips along x -- a line of 2, one link
    across = _info(_all_gather("[4,2]<=[2,4]T(1,0)", 8, k=2))
    assert ici_links(across, spec)[0] == 1
