"""Synthetic, realistic optimized-HLO text of any size: a deep unrolled transformer.

The text looks like what XLA:GPU prints after optimization (``--xla_dump_to``): one fused
computation per fusion (``fused_computation.N``), layer norms as kInput fusions with a
reduce, weights dynamic-sliced out of stacked parameters, ``dot`` with contracting dims,
all-reduce start/done pairs with iota replica groups, a GELU kLoop fusion, residual adds,
a while loop (scan over layers, known trip count) and ``metadata={op_name=... source_file=...
source_line=...}`` on every kernel. XLA's own parser (``jaxlib._hlo.hlo_module_from_text``)
accepts it, so the two parsers can be timed on the same text.

``generate(n)`` returns a module of at least ``n`` instructions (counted over every
computation, fused ones included), built of whole layers.
"""

from __future__ import annotations

import io

B, S, D, F = 4, 128, 1024, 4096  # batch, sequence, model width, MLP width
ACT = f"bf16[{B * S},{D}]{{1,0}}"
ACT_F32 = f"f32[{B * S},{D}]{{1,0}}"
HID = f"bf16[{B * S},{F}]{{1,0}}"
ROW = f"f32[{B * S}]{{0}}"


def _md(layer: int, what: str, line: int) -> str:
    return (f'metadata={{op_name="jit(forward)/layers_{layer}/{what}" '
            f'source_file="/src/model/transformer.py" source_line={line}}}')


class _Writer:
    def __init__(self, n_layers: int):
        self.out = io.StringIO()
        self.n = 0  # instruction ids, unique module-wide (as XLA numbers them)
        self.instructions = 0
        self.n_layers = n_layers
        self.entry_lines: list[str] = []

    def uid(self) -> int:
        self.n += 1
        return self.n

    def comp(self, header: str, lines: list[str]) -> None:
        self.instructions += len(lines)
        self.out.write(header + " {\n  " + "\n  ".join(lines) + "\n}\n\n")

    # ---- fused computations ------------------------------------------------------------
    def ln_fusion(self, layer: int) -> str:
        """RMS norm: convert, square, reduce(add), rsqrt, scale by gamma, convert back."""
        i = self.uid()
        name = f"fused_computation.{i}"
        self.comp(f"%{name} (param_0.{i}: {ACT}, param_1.{i}: bf16[{D}]) -> {ACT}", [
            f"%param_0.{i} = {ACT} parameter(0)",
            f"%convert.{i} = {ACT_F32} convert(%param_0.{i})",
            f"%multiply.{i} = {ACT_F32} multiply(%convert.{i}, %convert.{i})",
            f"%constant.{i} = f32[] constant(0)",
            f"%reduce.{i} = {ROW} reduce(%multiply.{i}, %constant.{i}), dimensions={{1}}, to_apply=%add_f32",
            f"%constant.{i}.1 = f32[] constant(0.0009765625)",
            f"%broadcast.{i}.1 = {ROW} broadcast(%constant.{i}.1), dimensions={{}}",
            f"%multiply.{i}.1 = {ROW} multiply(%reduce.{i}, %broadcast.{i}.1)",
            f"%rsqrt.{i} = {ROW} rsqrt(%multiply.{i}.1)",
            f"%broadcast.{i}.2 = {ACT_F32} broadcast(%rsqrt.{i}), dimensions={{0}}",
            f"%multiply.{i}.2 = {ACT_F32} multiply(%convert.{i}, %broadcast.{i}.2)",
            f"%param_1.{i} = bf16[{D}]{{0}} parameter(1)",
            f"%convert.{i}.1 = f32[{D}]{{0}} convert(%param_1.{i})",
            f"%broadcast.{i}.3 = {ACT_F32} broadcast(%convert.{i}.1), dimensions={{1}}",
            f"%multiply.{i}.3 = {ACT_F32} multiply(%multiply.{i}.2, %broadcast.{i}.3)",
            f"ROOT %convert.{i}.2 = {ACT} convert(%multiply.{i}.3)",
        ])
        return name

    def slice_fusion(self, stacked: str, out: str, dims: str) -> str:
        """One layer's weight out of a stacked [L, ...] parameter: dynamic-slice + bitcast."""
        i = self.uid()
        name = f"fused_computation.{i}"
        sliced = out.replace("bf16[", "bf16[1,").replace("{1,0}", "{2,1,0}")
        self.comp(f"%{name} (param_0.{i}: {stacked}, param_1.{i}: s32[]) -> {out}", [
            f"%param_0.{i} = {stacked} parameter(0)",
            f"%param_1.{i} = s32[] parameter(1)",
            f"%constant.{i} = s32[] constant(0)",
            f"%dynamic-slice.{i} = {sliced} dynamic-slice(%param_0.{i}, %param_1.{i}, %constant.{i}, "
            f"%constant.{i}), dynamic_slice_sizes={{1,{dims}}}",
            f"ROOT %bitcast.{i} = {out} bitcast(%dynamic-slice.{i})",
        ])
        return name

    def gelu_fusion(self) -> str:
        i = self.uid()
        name = f"fused_computation.{i}"
        hf = HID.replace("bf16", "f32")
        self.comp(f"%{name} (param_0.{i}: {HID}) -> {HID}", [
            f"%param_0.{i} = {HID} parameter(0)",
            f"%convert.{i} = {hf} convert(%param_0.{i})",
            f"%multiply.{i} = {hf} multiply(%convert.{i}, %convert.{i})",
            f"%multiply.{i}.1 = {hf} multiply(%multiply.{i}, %convert.{i})",
            f"%constant.{i} = f32[] constant(0.044715)",
            f"%broadcast.{i} = {hf} broadcast(%constant.{i}), dimensions={{}}",
            f"%multiply.{i}.2 = {hf} multiply(%multiply.{i}.1, %broadcast.{i})",
            f"%add.{i} = {hf} add(%convert.{i}, %multiply.{i}.2)",
            f"%tanh.{i} = {hf} tanh(%add.{i})",
            f"%multiply.{i}.3 = {hf} multiply(%convert.{i}, %tanh.{i})",
            f"ROOT %convert.{i}.1 = {HID} convert(%multiply.{i}.3)",
        ])
        return name

    def residual_fusion(self) -> str:
        i = self.uid()
        name = f"fused_computation.{i}"
        self.comp(f"%{name} (param_0.{i}: {ACT}, param_1.{i}: {ACT}) -> {ACT}", [
            f"%param_0.{i} = {ACT} parameter(0)",
            f"%param_1.{i} = {ACT} parameter(1)",
            f"ROOT %add.{i} = {ACT} add(%param_0.{i}, %param_1.{i})",
        ])
        return name

    # ---- one layer of kernels ----------------------------------------------------------
    def layer(self, layer: int, x: str, lines: list[str], params: dict[str, str],
              index: str) -> str:
        """Append one transformer layer (pre-norm attention projection + MLP) to ``lines``."""
        i = self.uid()
        wqkv, wup, wdown, gamma = (params[k] for k in ("wqkv", "wup", "wdown", "gamma"))
        ln = self.ln_fusion(layer)
        sq = self.slice_fusion(params["wqkv_t"], f"bf16[{D},{D}]{{1,0}}", f"{D},{D}")
        su = self.slice_fusion(params["wup_t"], f"bf16[{D},{F}]{{1,0}}", f"{D},{F}")
        sd = self.slice_fusion(params["wdown_t"], f"bf16[{F},{D}]{{1,0}}", f"{F},{D}")
        gelu = self.gelu_fusion()
        r1 = self.residual_fusion()
        r2 = self.residual_fusion()
        rg = "[1,8]<=[8]"
        lines += [
            f"%fusion.{i} = {ACT} fusion({x}, {gamma}), kind=kInput, calls=%{ln}, {_md(layer, 'rms_norm', 40)}",
            f"%fusion.{i}.1 = bf16[{D},{D}]{{1,0}} fusion({wqkv}, {index}), kind=kLoop, calls=%{sq}, "
            f"{_md(layer, 'attn/dynamic_slice', 52)}",
            f"%dot.{i} = {ACT} dot(%fusion.{i}, %fusion.{i}.1), lhs_contracting_dims={{1}}, "
            f"rhs_contracting_dims={{0}}, {_md(layer, 'attn/dot_general', 53)}",
            f"%all-reduce-start.{i} = {ACT} all-reduce-start(%dot.{i}), channel_id={i}, "
            f"replica_groups={rg}, use_global_device_ids=true, to_apply=%add_bf16, "
            f"{_md(layer, 'attn/psum', 54)}",
            f"%all-reduce-done.{i} = {ACT} all-reduce-done(%all-reduce-start.{i}), "
            f"{_md(layer, 'attn/psum', 54)}",
            f"%fusion.{i}.2 = {ACT} fusion({x}, %all-reduce-done.{i}), kind=kLoop, calls=%{r1}, "
            f"{_md(layer, 'add', 56)}",
            f"%fusion.{i}.3 = bf16[{D},{F}]{{1,0}} fusion({wup}, {index}), kind=kLoop, calls=%{su}, "
            f"{_md(layer, 'mlp/dynamic_slice', 60)}",
            f"%dot.{i}.1 = {HID} dot(%fusion.{i}.2, %fusion.{i}.3), lhs_contracting_dims={{1}}, "
            f"rhs_contracting_dims={{0}}, {_md(layer, 'mlp/up/dot_general', 61)}",
            f"%fusion.{i}.4 = {HID} fusion(%dot.{i}.1), kind=kLoop, calls=%{gelu}, {_md(layer, 'mlp/gelu', 62)}",
            f"%fusion.{i}.5 = bf16[{F},{D}]{{1,0}} fusion({wdown}, {index}), kind=kLoop, calls=%{sd}, "
            f"{_md(layer, 'mlp/dynamic_slice', 63)}",
            f"%dot.{i}.2 = {ACT} dot(%fusion.{i}.4, %fusion.{i}.5), lhs_contracting_dims={{1}}, "
            f"rhs_contracting_dims={{0}}, {_md(layer, 'mlp/down/dot_general', 64)}",
            f"%fusion.{i}.6 = {ACT} fusion(%fusion.{i}.2, %dot.{i}.2), kind=kLoop, calls=%{r2}, "
            f"{_md(layer, 'add', 65)}",
        ]
        return f"%fusion.{i}.6"


PER_LAYER = 12 + 16 + 3 * 5 + 11 + 2 * 3 + 1  # kernels + fused instructions + layer index constant


def generate(n_instructions: int, loop_layers: int = 2, trip_count: int = 4) -> str:
    """HLO text of a transformer with enough unrolled layers for ``n_instructions``.

    Args:
      n_instructions: lower bound on the instruction count (all computations).
      loop_layers: layers inside a while loop (a scan) that runs ``trip_count`` times.
    Returns the module text; its exact instruction count is ``count_instructions(text)``.
    """
    n_layers = max(1, -(-n_instructions // PER_LAYER) - loop_layers)
    L = n_layers + loop_layers
    w = _Writer(n_layers)
    stacked = {
        "wqkv_t": f"bf16[{L},{D},{D}]{{2,1,0}}", "wup_t": f"bf16[{L},{D},{F}]{{2,1,0}}",
        "wdown_t": f"bf16[{L},{F},{D}]{{2,1,0}}",
    }
    head = io.StringIO()
    for ty in ("f32", "bf16"):
        w.comp(f"%add_{ty} (x.{ty}: {ty}[], y.{ty}: {ty}[]) -> {ty}[]", [
            f"%x.{ty} = {ty}[] parameter(0)", f"%y.{ty} = {ty}[] parameter(1)",
            f"ROOT %add.{ty} = {ty}[] add(%x.{ty}, %y.{ty})"])

    # while loop over `loop_layers` layers (a scan), carrying (i, x, weights...)
    carry = (f"(s32[], {ACT}, {stacked['wqkv_t']}, {stacked['wup_t']}, {stacked['wdown_t']}, "
             f"bf16[{D}]{{0}})")
    body: list[str] = [f"%loop_param = {carry} parameter(0)"]
    names = ["i", "x", "wqkv", "wup", "wdown", "gamma"]
    shapes = ["s32[]", ACT, stacked["wqkv_t"], stacked["wup_t"], stacked["wdown_t"], f"bf16[{D}]{{0}}"]
    for k, (nm, sh) in enumerate(zip(names, shapes)):
        body.append(f"%gte.{nm} = {sh} get-tuple-element(%loop_param), index={k}")
    bp = {"wqkv": "%gte.wqkv", "wup": "%gte.wup", "wdown": "%gte.wdown", "gamma": "%gte.gamma", **stacked}
    x = "%gte.x"
    for layer in range(loop_layers):
        x = w.layer(layer, x, body, bp, "%gte.i")
    body += ["%one = s32[] constant(1)", "%next_i = s32[] add(%gte.i, %one)",
             f"ROOT %body_out = {carry} tuple(%next_i, {x}, %gte.wqkv, %gte.wup, %gte.wdown, %gte.gamma)"]
    w.comp(f"%scan_body (loop_param: {carry}) -> {carry}", body)
    w.comp(f"%scan_cond (cond_param: {carry}) -> pred[]", [
        f"%cond_param = {carry} parameter(0)",
        "%cond_i = s32[] get-tuple-element(%cond_param), index=0",
        f"%limit = s32[] constant({trip_count})",
        "ROOT %lt = pred[] compare(%cond_i, %limit), direction=LT"])

    entry = [f"%x = {ACT} parameter(0), {_md(0, 'x', 1)}",
             f"%params.wqkv = {stacked['wqkv_t']} parameter(1), metadata={{op_name=\"params['wqkv']\"}}",
             f"%params.wup = {stacked['wup_t']} parameter(2), metadata={{op_name=\"params['wup']\"}}",
             f"%params.wdown = {stacked['wdown_t']} parameter(3), metadata={{op_name=\"params['wdown']\"}}",
             f"%params.gamma = bf16[{D}]{{0}} parameter(4), metadata={{op_name=\"params['gamma']\"}}",
             "%zero = s32[] constant(0)",
             f"%init = {carry} tuple(%zero, %x, %params.wqkv, %params.wup, %params.wdown, %params.gamma)",
             f"%while = {carry} while(%init), condition=%scan_cond, body=%scan_body, "
             f'backend_config={{"known_trip_count":{{"n":"{trip_count}"}}}}',
             f"%scan_out = {ACT} get-tuple-element(%while), index=1"]
    ep = {"wqkv": "%params.wqkv", "wup": "%params.wup", "wdown": "%params.wdown",
          "gamma": "%params.gamma", **stacked}
    x = "%scan_out"
    for layer in range(loop_layers, L):
        entry.append(f"%layer_index.{layer} = s32[] constant({layer})")
        x = w.layer(layer, x, entry, ep, f"%layer_index.{layer}")
    entry[-1] = "ROOT " + entry[-1]
    layout = (f"({ACT}, {stacked['wqkv_t']}, {stacked['wup_t']}, {stacked['wdown_t']}, "
              f"bf16[{D}]{{0}})->{ACT}")
    w.comp("ENTRY %main", entry)
    head.write(f"HloModule synth_transformer_{L}_layers, entry_computation_layout={{{layout}}}, "
               f"num_partitions=8\n\n")
    return head.getvalue() + w.out.getvalue()


def count_instructions(text: str) -> int:
    """Instructions in ``text``: lines of the form ``[ROOT] %name = ...`` (one per line here)."""
    return sum(1 for ln in text.splitlines() if " = " in ln and not ln.startswith(("HloModule", "%", "ENTRY")))


if __name__ == "__main__":  # pragma: no cover
    import sys
    print(generate(int(sys.argv[1]) if len(sys.argv) > 1 else 200))


def generate_wide(n: int) -> str:
    """A module whose instructions are wide rather than many: one fusion of ``n`` operands
    returning an ``n``-tuple, ``n`` get-tuple-elements and a root tuple of ``n`` (about 4n
    instructions). Any per-operand or per-leaf cost that is not O(1) shows up here as
    superlinear time."""
    leaf = "f32[8]{0}"
    tup = ", ".join([leaf] * n)
    lines = ["HloModule wide", "", f"%fused_wide (q: {leaf}) -> ({tup}) {{"]
    lines += [f"  %q{i} = {leaf} parameter({i})" for i in range(n)]
    lines += [f"  %a{i} = {leaf} add(%q{i}, %q{i})" for i in range(n)]
    lines += [f"  ROOT %t = ({tup}) tuple({', '.join(f'%a{i}' for i in range(n))})", "}", "",
              "ENTRY %main {"]
    lines += [f"  %p{i} = {leaf} parameter({i})" for i in range(n)]
    lines += [f"  %fu = ({tup}) fusion({', '.join(f'%p{i}' for i in range(n))}), kind=kLoop, "
              "calls=%fused_wide"]
    lines += [f"  %g{i} = {leaf} get-tuple-element(%fu), index={i}" for i in range(n)]
    lines += [f"  ROOT %r = ({tup}) tuple({', '.join(f'%g{i}' for i in range(n))})", "}", ""]
    return "\n".join(lines)
