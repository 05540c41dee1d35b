"""The HLO text parser: the whole corpus, agreement with XLA's parser, shapes, errors."""

from __future__ import annotations

import pytest

from jaxmove.hlo import HloParseError, parse_file, parse_module
from jaxmove.hlo.replica_groups import ReplicaGroupsError, parse_replica_groups

from .conftest import corpus_file, corpus_files


def test_every_corpus_file_parses(corpus_dir):
    files = corpus_files()
    assert len(files) >= 30
    for f in files:
        m = parse_file(f)
        assert m.entry is not None and len(m.entry) > 0, f


def test_instruction_counts_agree_with_xla_parser(corpus_dir):
    _hlo = pytest.importorskip("jaxlib._hlo")
    for f in corpus_files():
        text = f.read_text()
        ours = {c.name: len(c) for c in parse_file(f).computations.values()}
        theirs = {c.name: len(list(c.instructions())) for c in _hlo.hlo_module_from_text(text).computations()}
        # XLA renames a computation when its name clashes (fused_computation -> fused_computation.2);
        # compare by name where both have it, and the rest as a multiset of counts.
        common = ours.keys() & theirs.keys()
        assert {k: ours[k] for k in common} == {k: theirs[k] for k in common}, f.name
        assert sorted(ours[k] for k in ours.keys() - common) == \
            sorted(theirs[k] for k in theirs.keys() - common), f.name


def test_shapes_layouts_and_subbyte_sizes():
    m = parse_module("""HloModule t
ENTRY e {
  a = s4[2,2048,32]{2,1,0:E(4)} parameter(0)
  b = bf16[8,128]{1,0:T(8,128)(2,1)S(1)} parameter(1)
  c = f32[<=4,3]{1,0} parameter(2)
  d = f4e2m1fn[256,256] parameter(3)
  e = (f32[2, 3], (s32[], token[]), /*index=2*/pred[]) parameter(4)
  ROOT t = (s4[2,2048,32], f32[<=4,3]) tuple(a, c)
}
""")
    p = {i.name: i.shape for i in m.entry}
    assert p["a"].byte_size == 2 * 2048 * 32 // 2  # 4 bits per element
    assert p["a"].layout.element_size_bits == 4
    assert p["b"].layout.tiles == ((8, 128), (2, 1)) and p["b"].layout.memory_space == 1
    assert p["b"].layout.minor_to_major == (1, 0)
    assert p["c"].dynamic == (True, False) and p["c"].dims == (4, 3)
    assert p["d"].byte_size == 256 * 256 // 2
    e = p["e"]
    assert e.is_tuple and e.tuple_shapes[0].dims == (2, 3)
    assert e.tuple_shapes[1].tuple_shapes[1].element_type == "token"
    assert e.byte_size == 2 * 3 * 4 + 4 + 1
    assert m.entry.root.name == "t"


def test_stack_frames_resolve_to_source(corpus_dir):
    m = parse_file(corpus_file("jax__source_mapper_test__HLO_EXAMPLE_stackframes.hlo"))
    root = m.entry.root
    assert root.metadata.op_name == "opname" and root.metadata.stack_frame_id == 1
    loc = m.source_location(root)
    assert (loc.file, loc.line, loc.function) == ("<embedded module>", 153, "main")


def test_no_header_no_entry_no_root(corpus_dir):
    m = parse_file(corpus_file("xla__multihost_runner__while_with_known_trip_count.hlo"))
    assert m.entry.name == list(m.computations)[-1]
    w = [i for i in m.instructions() if i.opcode == "while"][0]
    assert w.known_trip_count == 7


def test_escaped_backend_config_string(corpus_dir):
    m = parse_file(corpus_file("xla__kernel_reuse__module0.hlo"))
    gemms = [i for i in m.instructions() if i.custom_call_target == "__cublas$gemm"]
    assert len(gemms) == 4
    assert all("gemm_backend_config" in g.backend_config or "alpha_real" in g.backend_config for g in gemms)


def test_nested_operand_instruction(corpus_dir):
    m = parse_file(corpus_file("xla__block_scaling_rewriter_cudnn_test__Nvfp4.hlo"))
    lhs = m.entry.by_name["lhs"]
    inner = m.entry.by_name[lhs.operands[0]]
    assert inner.opcode == "multiply" and inner.operands == ("p0", "mult")
    assert m.entry.root.custom_call_target == "__op$block_scaled_dot"


def test_metadata_with_escaped_quotes():
    m = parse_module(r"""HloModule t
ENTRY e {
  ROOT p = f32[4]{0} parameter(0), metadata={op_name="p[\'w\']" source_file="a.py" source_line=7}
}
""")
    md = m.entry.root.metadata
    assert md.op_name == "p['w']" and md.source_line == 7
    assert m.source_location(m.entry.root).file == "a.py"


@pytest.mark.parametrize("text,line,col,expected", [
    ("HloModule t\nENTRY e {\n  ROOT p = f32[8,128 parameter(0)\n}\n", 3, 16, "expected ']' closing dimensions of f32[8,128"),
    ("HloModule t\nENTRY e {\n  p = f32[4] parameter(0)\n  ROOT a = f32[4] add(p, q)\n}\n", 4, 8, "undefined operand 'q'"),
    ("HloModule t\nENTRY e {\n  p = f32[4] parameter(0)\n", 4, 1, "expected '}' closing computation 'e'"),
    ("HloModule t\nENTRY e {\n  p = f33[4] parameter(0)\n}\n", 3, 7, "unknown element type 'f33'"),
    ("HloModule t\nENTRY e {\n  p = f32[4] parameter(0)\n  p = f32[4] parameter(1)\n}\n", 4, 3, "duplicate instruction name 'p'"),
    ("HloModule t\nENTRY e {\n  ROOT p = f32[4] parameter(0), metadata={op_name=\"x\"\n}\n", 5, 1, "expected '}' closing computation 'e'"),
    ("HloModule t\nENTRY e {\n  ROOT p = f32[4]{0 parameter(0)\n}\n", 3, 18, "expected '}' closing the layout of f32[4]"),
    ("HloModule t\nENTRY e {\n  ROOT c = f32[4] call(), to_apply=nowhere\n}\n", 3, 8, "undefined computation 'nowhere'"),
    # the parameter list of a computation: its shapes are read as XLA reads them (a user trial
    # found an unknown type there accepted): the one-line form XLA prints, and the general form
    # (a comment before '{', a tuple, a line break)
    ("HloModule t\nENTRY %e (p: f33[4]) -> f32[4] {\n  ROOT p = f32[4] parameter(0)\n}\n", 2, 14,
     "unknown element type 'f33' in shape of parameter list of computation 'e'"),
    ("HloModule t\nENTRY %e (p: f32[4,x]) -> f32[4] {\n  ROOT p = f32[4] parameter(0)\n}\n", 2, 20,
     "expected a dimension size"),
    ("HloModule t\nENTRY %e (p: (s32[], /*index=1*/f33[4])) -> s32[] /* c */ {\n"
     "  p = (s32[], f32[4]) parameter(0)\n  ROOT g = s32[] get-tuple-element(p), index=0\n}\n", 2, 33,
     "unknown element type 'f33'"),
    ("HloModule t\nENTRY %e (p: f32[4],\n    q: bf17[2]) -> f32[4] {\n  p = f32[4] parameter(0)\n"
     "  q = f32[2] parameter(1)\n  ROOT a = f32[4] add(p, p)\n}\n", 3, 8, "unknown element type 'bf17'"),
])
def test_errors_name_line_column_and_expectation(text, line, col, expected):
    with pytest.raises(HloParseError) as ei:
        parse_module(text, "bad.hlo")
    e = ei.value
    assert expected in e.expected, str(e)
    assert (e.filename, e.line, e.column) == ("bad.hlo", line, col), str(e)


def test_parameter_lists_xla_prints_take_the_fast_header():
    """Every shape form XLA prints in a parameter list (each element type, dynamic and
    unbounded dimensions, tiled layouts with memory spaces, tuples with ``/*index=N*/``) takes
    the one-line header path, and the module parses."""
    from jaxmove.hlo.parser import _HEADER
    from jaxmove.hlo.shape import PRIMITIVE_BIT_WIDTHS
    arrays = [f"{t}[2]" for t in sorted(PRIMITIVE_BIT_WIDTHS) if t not in ("token", "opaque")]
    arrays += ["f32[<=4,?]", "bf16[8,128]{1,0:T(8,128)(2,1)S(1)}", "s4[2]{0:E(4)}", "token[]"]
    params = ", ".join(f"p{i}: {a}" for i, a in enumerate(arrays))
    params += ", t: (s32[], f32[], f32[], f32[], f32[], /*index=5*/f32[2]{0})"
    header = f"%c ({params}) -> f32[] {{"
    assert _HEADER.match(header) is not None
    body = "\n".join(f"  p{i} = {a} parameter({i})" for i, a in enumerate(arrays))
    text = (f"HloModule t\n\nENTRY {header}\n{body}\n  t = (s32[], f32[], f32[], f32[], f32[], f32[2]{{0}}) "
            f"parameter({len(arrays)})\n  ROOT r = f32[] constant(0)\n}}\n")
    assert len(parse_module(text).entry.parameters) == len(arrays) + 1


def test_truncated_corpus_file_raises_clean_error(corpus_dir):
    text = corpus_file("xla__sharded_computation.hlo").read_text()
    last_root = text.rfind("ROOT")
    for cut in (len(text) // 3, len(text) // 2, last_root + 12, last_root + 40):
        with pytest.raises(HloParseError):
            parse_module(text[:cut], "cut.hlo")


def test_replica_groups_forms():
    assert parse_replica_groups("[2,4]<=[4,2]T(1,0)") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert parse_replica_groups("{{0,1},{2,3}}") == [[0, 1], [2, 3]]
    assert parse_replica_groups("[1,8]<=[8]") == [list(range(8))]
    assert parse_replica_groups("{}") == []
    with pytest.raises(ReplicaGroupsError, match="hold 16"):
        parse_replica_groups("[2,2]<=[16]")


# ---- validation: every check names file, line and column (issue 7) ------------------------

_ADD = "add {\n  x = f32[] parameter(0)\n  y = f32[] parameter(1)\n  ROOT s = f32[] add(x, y)\n}\n"


def _slow_form(text: str) -> str:
    """The same module with a comment after every instruction: the parser's one-line fast
    path declines such lines, so the general code reads them (same positions expected)."""
    return "\n".join(ln + " // c" if " = " in ln else ln for ln in text.split("\n"))


# (text, line, column, expected): columns are counted by hand from the text.
VALIDATION_CASES = [
    # element counts: 4*8 = 32 elements cannot become 31 (XLA's parser aborts on this one)
    ("HloModule t\nENTRY e {\n  p = f32[4,8] parameter(0)\n  ROOT r = f32[31] reshape(p)\n}\n",
     4, 8, "reshape 'r' changes the element count: operand f32[4,8] has 32 elements, result f32[31] has 31"),
    # bitcast keeps bytes: 128 bytes vs 64
    ("HloModule t\nENTRY e {\n  p = f32[4,8] parameter(0)\n  ROOT b = f32[16] bitcast(p)\n}\n",
     4, 8, "bitcast 'b' changes the byte size: operand f32[4,8] is 128 bytes, result f32[16] is 64"),
    # bitcast-convert f32 -> s16 must add a trailing dimension of 32/16 = 2
    ("HloModule t\nENTRY e {\n  p = f32[4] parameter(0)\n  ROOT c = s16[4] bitcast-convert(p)\n}\n",
     4, 8, "the result must have dimensions [4, 2]"),
    # iota replica groups: 2 groups x 3 devices = 6, but [4] holds 4; column of '[' after '='
    (_ADD + "ENTRY e {\n  p = f32[8] parameter(0)\n"
     "  ROOT a = f32[8] all-reduce(p), replica_groups=[2,3]<=[4], to_apply=add\n}\n",
     8, 49, "2x3 = 6 devices in groups but the reshape dims [4] hold 4"),
    # duplicate names: computation, and parameter number
    (_ADD + _ADD + "ENTRY e {\n  ROOT p = f32[] parameter(0)\n}\n", 6, 1, "duplicate computation name 'add'"),
    ("HloModule t\nENTRY e {\n  p = f32[] parameter(0)\n  ROOT q = f32[] parameter(0)\n}\n",
     4, 8, "parameter number 0 of computation 'e' is already used by 'p'"),
    ("HloModule t\nENTRY e {\n  p = f32[] parameter(0)\n  ROOT q = f32[] parameter(2)\n}\n",
     4, 8, "has parameter(2) but no parameter(1)"),
    # cycles: through the call graph, through a computation calling itself, through operands
    ("HloModule t\na {\n  p = f32[] parameter(0)\n  ROOT c = f32[] call(p), to_apply=b\n}\n"
     "b {\n  p = f32[] parameter(0)\n  ROOT c = f32[] call(p), to_apply=a\n}\n"
     "ENTRY e {\n  p = f32[] parameter(0)\n  ROOT c = f32[] call(p), to_apply=a\n}\n",
     8, 8, "call graph cycle: a -> b -> a"),
    ("HloModule t\nENTRY e {\n  p = f32[] parameter(0)\n  ROOT c = f32[] call(p), to_apply=e\n}\n",
     4, 8, "call graph cycle: e -> e"),
    ("HloModule t\nENTRY e {\n  p = f32[4] parameter(0)\n  a = f32[4] add(p, b)\n  ROOT b = f32[4] negate(a)\n}\n",
     4, 3, "operand cycle: a -> b -> a"),
    ("HloModule t\nENTRY e {\n  p = f32[4] parameter(0)\n  ROOT a = f32[4] add(p, b)\n  b = f32[4] negate(p)\n}\n",
     4, 8, "uses operand 'b' before its definition at line 5"),
    # operand counts of known opcodes
    ("HloModule t\nENTRY e {\n  p = f32[4] parameter(0)\n  ROOT a = f32[4] add(p)\n}\n",
     4, 8, "'add' instruction 'a' takes 2 operands, got 1"),
    ("HloModule t\nENTRY e {\n  p = f32[4] parameter(0)\n  ROOT n = f32[4] negate(p, p)\n}\n",
     4, 8, "'negate' instruction 'n' takes 1 operand, got 2"),
    ("HloModule t\nENTRY e {\n  p = pred[4] parameter(0)\n  ROOT s = pred[4] select(p, p)\n}\n",
     4, 8, "'select' instruction 's' takes 3 operands, got 2"),
    ("HloModule t\nENTRY e {\n  p = f32[4,4] parameter(0)\n  ROOT d = f32[4,4] dot(p, p, p), "
     "lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n", 4, 8, "'dot' instruction 'd' takes 2 operands, got 3"),
    # rank 2: operand + 2 scalar indices = 3 operands, not 4
    ("HloModule t\nENTRY e {\n  p = f32[4,8] parameter(0)\n  i = s32[] parameter(1)\n"
     "  ROOT d = f32[1,8] dynamic-slice(p, i, i, i), dynamic_slice_sizes={1,8}\n}\n",
     5, 8, "of a rank-2 operand takes 3 operands"),
    # dynamic-update-slice of rank 2: operand, update + 2 indices = 4, not 3 (index is a scalar)
    ("HloModule t\nENTRY e {\n  p = f32[4,8] parameter(0)\n  u = f32[1,8] parameter(1)\n"
     "  i = s32[] parameter(2)\n  ROOT d = f32[4,8] dynamic-update-slice(p, u, i)\n}\n",
     6, 8, "of a rank-2 operand takes 4 operands"),
    # shapes that tuple / get-tuple-element / fusion disagree on
    ("HloModule t\nENTRY e {\n  p = (f32[4], s32[]) parameter(0)\n  ROOT g = f32[4] get-tuple-element(p), index=2\n}\n",
     4, 8, "index=2 is not an element of its operand's shape (f32[4], s32[])"),
    # (validate_module's get-tuple-element shortcut falls back to the full check for each)
    ("HloModule t\nENTRY e {\n  p = (f32[4], s32[]) parameter(0)\n  ROOT g = s32[] get-tuple-element(p), index=0\n}\n",
     4, 8, "get-tuple-element 'g' has shape s32[] but element 0 of its operand is f32[4]"),
    ("HloModule t\nENTRY e {\n  p = (f32[4], s32[]) parameter(0)\n"
     "  ROOT g = f32[4] get-tuple-element(p), index=0, index=1\n}\n",
     4, 8, "get-tuple-element 'g' has shape f32[4] but element 1 of its operand is s32[]"),
    ("HloModule t\nENTRY e {\n  p = f32[4] parameter(0)\n  ROOT g = f32[4] get-tuple-element(p), index=0\n}\n",
     4, 8, "index=0 is not an element of its operand's shape f32[4]"),
    ("HloModule t\nENTRY e {\n  p = (f32[4], s32[]) parameter(0)\n  ROOT g = f32[4] get-tuple-element(p), index=x\n}\n",
     4, 8, "get-tuple-element 'g' needs index=<integer>"),
    ("HloModule t\nENTRY e {\n  p = f32[4] parameter(0)\n  ROOT t = (f32[4], f32[4]) tuple(p)\n}\n",
     4, 8, "which is not the tuple of its 1 operands' shapes"),
    ("HloModule t\nf {\n  x = f32[4] parameter(0)\n  ROOT y = f32[4] negate(x)\n}\n"
     "ENTRY e {\n  p = f32[4] parameter(0)\n  ROOT r = f32[4] fusion(p, p), kind=kLoop, calls=f\n}\n",
     8, 8, "fusion 'r' passes 2 operands to computation 'f', which has 1 parameters"),
    ("HloModule t\nENTRY e {\n  p = f32[4] parameter(0)\n  ROOT w = f32[4] while(p), body=e\n}\n",
     4, 8, "'while' instruction 'w' has no condition= attribute"),
]


@pytest.mark.parametrize("form", ["fast", "slow"])
@pytest.mark.parametrize("text,line,col,expected", VALIDATION_CASES)
def test_validation_errors_name_exact_position(text, line, col, expected, form):
    if form == "slow":
        text = _slow_form(text)
    with pytest.raises(HloParseError) as ei:
        parse_module(text, "bad.hlo")
    e = ei.value
    assert expected in e.expected, str(e)
    assert (e.filename, e.line, e.column) == ("bad.hlo", line, col), str(e)
    assert str(e).startswith(f"bad.hlo:{line}:{col}: ")


def test_valid_forms_pass_validation():
    """The accepted side of each rule: equal counts, XLA's bitcast-convert shapes, the
    vector-index forms of dynamic-(update-)slice, iota groups that multiply out."""
    m = parse_module(_ADD + """ENTRY e {
  p = f32[4,8] parameter(0)
  r = f32[32] reshape(p)
  b = s32[2,16] bitcast(p)
  c = s16[4,8,2] bitcast-convert(p)
  d = f32[4,8] bitcast-convert(c)
  v = s32[2] parameter(1)
  ds = f32[1,8] dynamic-slice(p, v), dynamic_slice_sizes={1,8}
  u = f32[1,8] parameter(2)
  dus = f32[4,8] dynamic-update-slice(p, u, v)
  ar = f32[4,8] all-reduce(d), replica_groups=[2,4]<=[4,2]T(1,0), to_apply=add
  ROOT t = (f32[32], s32[2,16], f32[4,8], f32[1,8], f32[4,8]) tuple(r, b, ar, ds, dus)
}
""")
    assert m.entry.root.opcode == "tuple" and len(m.entry) == 11


def test_xla_parser_aborts_where_ours_reports(tmp_path):
    """XLA's own parser CHECK-fails (aborts the process) on a reshape of 32 elements to 31;
    jaxmove raises HloParseError. Run XLA's in a subprocess so the abort cannot kill pytest."""
    pytest.importorskip("jaxlib._hlo")
    import subprocess
    import sys
    text = VALIDATION_CASES[0][0]
    proc = subprocess.run([sys.executable, "-c", "import sys; from jaxlib import _hlo; "
                           "_hlo.hlo_module_from_text(sys.stdin.read())"],
                          input=text, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    with pytest.raises(HloParseError):
        parse_module(text)


def _digest(module):
    return [(c.name, c.is_entry, c.root.name,
             [(i.name, i.opcode, str(i.shape), i.shape, i.operands, i.attrs, i.literal, i.is_root,
               i.line, i.column, i.parameter_number) for i in c.instructions])
            for c in module.computations.values()]


def test_fast_and_general_parser_paths_agree(corpus_dir):
    """The one-line fast path reads exactly what the general parser reads: every corpus
    module parsed as is equals the module parsed with a comment after each instruction
    line (which the fast path declines), down to attribute texts, lines and columns."""
    for f in corpus_files():
        text = f.read_text()
        slow = _slow_form(text)
        assert _digest(parse_module(text)) == _digest(parse_module(slow)), f.name


@pytest.mark.parametrize("text,line,col,expected", [
    ("HloModule t\nENTRY e {\n  a = f32[4,8] parameter(0)\n  b = f32[3,8] parameter(1)\n  ROOT c = f32[4,8] add(a, b)\n}\n",
     5, 8, "operand 'b' is f32[3,8]"),
    ("HloModule t\nENTRY e {\n  ROOT p = f32[99999999999999999999,8] parameter(0)\n}\n", 3, 16, "too large"),
    ("HloModule t\nENTRY e {\n  ROOT p = f32[4294967296,4294967296,4294967296] parameter(0)\n}\n", 3, 16, "too large"),
])
def test_shape_validation_errors(text, line, col, expected):
    with pytest.raises(HloParseError) as ei:
        parse_module(text, "bad.hlo")
    assert expected in ei.value.expected and (ei.value.line, ei.value.column) == (line, col), str(ei.value)


def test_truncation_after_a_complete_computation_is_caught():
    text = """HloModule m, entry_computation_layout={(f32[4]{0}, f32[4]{0})->f32[4]{0}}

helper {
  x = f32[4]{0} parameter(0)
  ROOT n = f32[4]{0} negate(x)
}

ENTRY main {
  a = f32[4]{0} parameter(0)
  b = f32[4]{0} parameter(1)
  ROOT s = f32[4]{0} add(a, b)
}
"""
    assert len(parse_module(text).entry.parameters) == 2
    cut = text[: text.index("ENTRY")]
    with pytest.raises(HloParseError) as ei:
        parse_module(cut, "cut.hlo")
    assert "2 parameters" in ei.value.expected and "truncated" in ei.value.expected
    assert ei.value.line == cut.count("\n") + 1


def test_computation_with_execution_thread_after_its_brace():
    # XLA:TPU (jaxlib 0.10.2, mixtral-8x7b-train tiny on v5p, fsdp_tp) prints a SparseCore
    # scatter region as `}, execution_thread="sparsecore"`: it was rejected ("expected
    # computation name ..., found ','")
    m = parse_module("""HloModule m

%region (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}, execution_thread="sparsecore"

ENTRY %e (x: f32[8]) -> f32[] {
  %x = f32[8]{0} parameter(0)
  %z = f32[] constant(0)
  ROOT %r = f32[] reduce(%x, %z), dimensions={0}, to_apply=%region
}
""")
    assert m.computations["region"].execution_thread == "sparsecore"
    assert m.entry.execution_thread == "main"
    with pytest.raises(HloParseError, match="after its '}'"):
        parse_module("HloModule m\n\nENTRY %e (x: f32[8]) -> f32[8] {\n  ROOT %x = f32[8]{0} parameter(0)\n}, 7\n")


# ---- string escapes as XLA's lexer reads them (issue 29) ------------------------------------
# hlo_lexer.cc LexString unescapes every string token with absl::CUnescape; the parser dropped
# the backslash of \033 (op_name "\033[31m" was read as "033[31m").

def _escaped_module(op_name: str, source_file: str = "/s/m.py") -> str:
    return ("HloModule m\n\nENTRY main {\n  p0 = f32[4]{0} parameter(0)\n"
            f'  ROOT a = f32[4]{{0}} negate(p0), metadata={{op_name="{op_name}" '
            f'source_file="{source_file}" source_line=3}}\n}}\n')


#: (escaped text as written in HLO, the bytes it stands for: C's escapes written out by hand)
_ESCAPES = [
    (r"a\033[31mb", b"a\x1b[31mb"), (r"\x1b]0;t\007", b"\x1b]0;t\x07"), (r"\x41\101", b"AA"),
    (r"q\"q\\q\'q\?", b"q\"q\\q'q?"), (r"\n\t\r\a\b\f\v", b"\n\t\r\a\b\f\v"),
    (r"\0x", b"\x00x"), (r"\1234", b"S4"), (r"\x0041", b"A"), (r"\X4a", b"J"),
    (r"\303\251t\u00e9", "été".encode()), (r"\U0001F600", "\U0001F600".encode()),
    (r"bad\377byte", b"bad\xffbyte"), ("plain é", "plain é".encode()),
]


def _xla_metadata(text: str) -> list[dict[int, bytes]]:
    """XLA's own parse: each instruction's OpMetadata fields {number: bytes} (op_type 1, op_name
    2, source_file 3; xla_data.proto), read from the serialized HloModuleProto (computations 3,
    instructions 2, metadata 7; hlo.proto) by a minimal protobuf walk."""
    _hlo = pytest.importorskip("jaxlib._hlo")

    def fields(buf: bytes):
        i = 0

        def varint() -> int:
            nonlocal i
            shift = v = 0
            while True:
                b = buf[i]
                i += 1
                v |= (b & 0x7F) << shift
                shift += 7
                if b < 0x80:
                    return v
        while i < len(buf):
            key = varint()
            num, wire = key >> 3, key & 7
            if wire == 0:
                yield num, varint()
            elif wire == 2:
                n = varint()
                yield num, buf[i:i + n]
                i += n
            else:
                step = {1: 8, 5: 4}[wire]
                yield num, buf[i:i + step]
                i += step

    proto = _hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto()
    out = []
    for num, comp in fields(proto):
        if num != 3:
            continue
        for n2, instr in fields(comp):
            if n2 == 2:
                md = [v for n3, v in fields(instr) if n3 == 7]
                out.append({k: v for k, v in fields(md[0]) if isinstance(v, bytes)} if md else {})
    return out


@pytest.mark.parametrize("escaped,want", _ESCAPES)
def test_string_escapes_read_as_c_escapes(escaped, want):
    md = parse_module(_escaped_module(escaped, escaped + ".py")).entry.root.metadata
    assert md.op_name.encode("utf-8", "surrogateescape") == want
    assert md.source_file.encode("utf-8", "surrogateescape") == want + b".py"


def test_string_escapes_equal_xlas_parse():
    _hlo = pytest.importorskip("jaxlib._hlo")  # noqa: F841
    for escaped, want in _ESCAPES:
        text = _escaped_module(escaped, escaped + ".py")
        (xla,) = [m for m in _xla_metadata(text) if m.get(2)]
        md = parse_module(text).entry.root.metadata
        assert md.op_name.encode("utf-8", "surrogateescape") == xla[2] == want, escaped
        assert md.source_file.encode("utf-8", "surrogateescape") == xla[3], escaped


#: escapes absl::CUnescape refuses, with (part of) its message
_BAD_ESCAPES = [(r"\q", "Unknown escape sequence: \\q"), (r"\777", "Value of \\777 exceeds 0xff"),
                (r"\x100", "exceeds 0xff"), (r"\xg", "\\x cannot be followed by a non-hex digit"),
                (r"\u12", "\\u must be followed by 4 hex digits"), (r"\ud800", "surrogate"),
                (r"\U00110000", "exceeds Unicode limit")]


@pytest.mark.parametrize("escaped,what", _BAD_ESCAPES)
def test_escapes_xla_refuses_are_parse_errors(escaped, what):
    text = _escaped_module(escaped)
    with pytest.raises(HloParseError) as ei:
        parse_module(text, "esc.hlo")
    assert (ei.value.line, ei.value.filename) == (5, "esc.hlo")
    assert what in str(ei.value) and "metadata" in str(ei.value)


def test_a_trailing_backslash_cannot_be_unescaped():
    """(A lexed string cannot end in one backslash: it escapes the closing quote.)"""
    from jaxmove.hlo.attrs import EscapeError, c_unescape

    with pytest.raises(EscapeError, match="cannot end with"):
        c_unescape("ab\\")


def test_escapes_xla_refuses_xla_refuses_too():
    _hlo = pytest.importorskip("jaxlib._hlo")
    for escaped, _ in _BAD_ESCAPES:
        with pytest.raises(Exception, match="parse"):
            _hlo.hlo_module_from_text(_escaped_module(escaped))


def test_escapes_in_other_strings():
    """custom_call_target's escapes are read too; a StackFrames file name with a bad escape, a
    frontend attribute, a quoted backend_config are refused; a JSON backend_config is read raw
    (XLA's LexJsonDict), so its JSON escape \\/ is no error."""
    m = parse_module("HloModule m\n\nENTRY main {\n  p0 = f32[4]{0} parameter(0)\n"
                     '  ROOT c = f32[4]{0} custom-call(p0), custom_call_target="my\\044call", '
                     'backend_config={"a":"x\\/y"}\n}\n')
    assert m.entry.root.custom_call_target == "my$call"
    for attr in ('frontend_attributes={k="v\\q"}', 'backend_config="{\\q}"'):
        with pytest.raises(HloParseError, match="Unknown escape sequence"):
            parse_module("HloModule m\n\nENTRY main {\n  p0 = f32[4]{0} parameter(0)\n"
                         f'  ROOT c = f32[4]{{0}} custom-call(p0), custom_call_target="t", {attr}\n}}\n')
    with pytest.raises(HloParseError, match="FileNames entry 1.*Unknown escape"):
        parse_module('HloModule m\n\nFileNames\n1 "a\\qb.py"\n\nENTRY main {\n'
                     "  ROOT p0 = f32[4]{0} parameter(0)\n}\n")


def test_execution_thread_escapes():
    text = """HloModule m

%region (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}, execution_thread="sparse\\143ore"

ENTRY %e (x: f32[8]) -> f32[] {
  %x = f32[8]{0} parameter(0)
  %z = f32[] constant(0)
  ROOT %r = f32[] reduce(%x, %z), dimensions={0}, to_apply=%region
}
"""
    assert parse_module(text).computations["region"].execution_thread == "sparsecore"  # \143 = 'c'
    with pytest.raises(HloParseError, match="execution_thread.*Unknown escape sequence"):
        parse_module(text.replace("\\143", "\\q"))
