"""Hand-written XLA:TPU HLO shared by several tests (one copy of each program)."""

from __future__ import annotations

from jaxmove.hlo import parse_module
from jaxmove.passes.pipeline import analyze_module


def analyze_rows(text: str, roles: dict[int, str] | None = None, name: str = "tpu.hlo"):
    """(ModuleAnalysis, instruction name -> row) of an HLO text."""
    an = analyze_module(parse_module(text, name), roles)
    return an, {r.instr.name: r for r in an.rows}


# XLA:TPU's decomposed async all-gather (libtpu 0.0.42, an FSDP weight): start fusion (root
# AsyncCollectiveStart), a continuation fusion carrying the same collective (channel_id=6)
# beside a dot, and the done fusion (root AsyncCollectiveDone). The start's result also holds
# the collective's scalar memory (s32[2] S(4)) and sync flags (u32[] S(2)).
DECOMPOSED_ALL_GATHER = """HloModule tpu_ag
ag_start {
  p0 = bf16[512,1024]{1,0:S(1)} parameter(0)
  ag = bf16[1024,1024]{1,0} all-gather(p0), channel_id=6, replica_groups={{0,1}}, dimensions={0}, use_global_device_ids=true
  ROOT cc = (bf16[512,1024]{1,0:S(1)}, bf16[1024,1024]{1,0}, s32[2]{0:S(4)}, u32[]{:S(2)}, u32[]{:S(2)}, u32[]{:S(2)}) custom-call(ag), custom_call_target="AsyncCollectiveStart"
}
ag_cont {
  p0 = bf16[512,1024]{1,0:S(1)} parameter(0)
  p1 = bf16[1024,1024]{1,0} parameter(1)
  x = bf16[8,1024]{1,0} parameter(2)
  w = bf16[1024,1024]{1,0} parameter(3)
  d = bf16[8,1024]{1,0} dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ag = bf16[1024,1024]{1,0} all-gather(p0), channel_id=6, replica_groups={{0,1}}, dimensions={0}, use_global_device_ids=true
  ROOT t = (bf16[8,1024]{1,0}, bf16[512,1024]{1,0:S(1)}, bf16[1024,1024]{1,0}, bf16[1024,1024]{1,0}) tuple(d, p0, p1, ag)
}
ag_done {
  p0 = bf16[512,1024]{1,0:S(1)} parameter(0)
  p1 = bf16[1024,1024]{1,0} parameter(1)
  ag = bf16[1024,1024]{1,0} all-gather(p0), channel_id=6, replica_groups={{0,1}}, dimensions={0}, use_global_device_ids=true
  ROOT cc = bf16[1024,1024]{1,0} custom-call(p0, p1, ag), custom_call_target="AsyncCollectiveDone"
}
use {
  x = bf16[8,1024]{1,0} parameter(0)
  w = bf16[1024,1024]{1,0} parameter(1)
  ROOT d = bf16[8,1024]{1,0} dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
ENTRY e {
  w2 = bf16[512,1024]{1,0} parameter(0)
  w1 = bf16[1024,1024]{1,0} parameter(1)
  x = bf16[8,1024]{1,0} parameter(2)
  v = bf16[512,1024]{1,0:S(1)} copy(w2)
  s = (bf16[512,1024]{1,0:S(1)}, bf16[1024,1024]{1,0}, s32[2]{0:S(4)}, u32[]{:S(2)}, u32[]{:S(2)}, u32[]{:S(2)}) fusion(v), kind=kCustom, calls=ag_start, output_to_operand_aliasing={{0}: (0, {})}
  s0 = bf16[512,1024]{1,0:S(1)} get-tuple-element(s), index=0
  s1 = bf16[1024,1024]{1,0} get-tuple-element(s), index=1
  c = (bf16[8,1024]{1,0}, bf16[512,1024]{1,0:S(1)}, bf16[1024,1024]{1,0}, bf16[1024,1024]{1,0}) fusion(s0, s1, x, w1), kind=kOutput, calls=ag_cont, output_to_operand_aliasing={{1}: (0, {}), {2}: (1, {}), {3}: (1, {})}
  c0 = bf16[8,1024]{1,0} get-tuple-element(c), index=0
  c1 = bf16[512,1024]{1,0:S(1)} get-tuple-element(c), index=1
  c3 = bf16[1024,1024]{1,0} get-tuple-element(c), index=3
  dn = bf16[1024,1024]{1,0} fusion(c1, c3), kind=kCustom, calls=ag_done, output_to_operand_aliasing={{}: (1, {})}
  ROOT y = bf16[8,1024]{1,0} fusion(c0, dn), kind=kOutput, calls=use
}"""
