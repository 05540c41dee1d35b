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
])
def test_errors_name_line_column_and_expectation(text, line, col, expected):
    with pytest.raises(HloParseError) as ei:
        parse_module(text, "bad.hlo")
    e = ei.value
    assert expected in e.expected, str(e)
    assert (e.filename, e.line, e.column) == ("bad.hlo", line, col), str(e)


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
