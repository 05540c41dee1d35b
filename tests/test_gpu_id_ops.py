"""partition-id / replica-id on GPUs: XLA:GPU writes the id with a device operation of its own
(ReplicaOrPartitionIdThunk: a 4-byte Memset32 on the stream; xla/backends/gpu/runtime/
replica_id_thunk.cc), which a capture times (2.05 us on the A100 Pax step, benchmarks/profiles.md;
it was estimated at 0 s, a 100% error); on TPU and CPU specs it stays free."""

from __future__ import annotations

import pytest

import jaxmove

_HLO = """HloModule m, num_partitions=2

ENTRY e {
  p = f32[2,8]{1,0} parameter(0)
  id = u32[] partition-id()
  i = s32[] convert(id)
  z = s32[] constant(0)
  ROOT d = f32[1,8]{1,0} dynamic-slice(p, i, z), dynamic_slice_sizes={1,8}
}
"""


@pytest.mark.parametrize("hardware,launches", [("h100-sxm", True), ("a100-40gb", True),
                                               ("tpu-v5e", False), ("cpu-generic", False)])
def test_partition_id_is_a_launch_on_gpus_only(tmp_path, hardware, launches):
    path = tmp_path / "m.hlo"
    path.write_text(_HLO)
    r = jaxmove.analyze(str(path), hardware=hardware)
    t = r.times.rows[("e", "id")]
    assert t.launches_kernel is launches
    if launches:
        assert t.est_time_s >= r.times.spec.kernel_launch_overhead_s > 0
    else:
        assert t.est_time_s == 0
