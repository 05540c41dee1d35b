"""First touch: bytes a kernel writes into pages the OS maps fresh during the program run.

Why (measured, CPU): XLA:CPU gives each program run one temp allocation holding every
intermediate buffer (the buffer assigner packs them with the heap simulator), plus one
allocation per output. The host allocator serves large allocations with ``mmap`` and
returns them with ``munmap`` on free (glibc: above ``M_MMAP_THRESHOLD``, whose dynamic
value never exceeds 32 MiB on 64-bit; mallopt(3)), so every page of such an allocation is
mapped and zeroed by a page fault the first time the run writes it — again on every run.
On the 2-core CI host, ``ru_minflt`` per run of ``gpt2-small-decode --set layers=2`` equals
its compiled temp size in 4 KiB pages exactly, and those faults run at about 2 GB/s, 30x
slower than the DRAM stream; they dominated the bf16->f32 weight converts.

Model (per program run, ENTRY computation only):

* Walk the ENTRY schedule keeping the live intermediate ("temp") bytes: an instruction that
  defines a buffer adds its output bytes (minus bytes it updates in place, from the traffic
  pass); a buffer is freed after its last user (through aliases: bitcast, tuple,
  get-tuple-element, while, in-place updates). The temp allocation is then the high-water
  mark H of that walk (perfect reuse; XLA's packing can only be larger).
* When H >= ``spec.mmap_threshold_bytes`` the temp allocation is freshly mapped each run and
  an instruction first-touches ``max(0, live - previous high-water mark)`` bytes: the
  amount by which it pushes the high-water mark up.
* Each leaf of the program's result that is not donated (``input_output_alias``) is its own
  allocation: first-touched by its producer when it is >= the threshold.
* Below the threshold an allocation is reused from the heap across runs: nothing counted.

The time of first-touch bytes is ``bytes / spec.first_touch_bytes_per_s`` (``passes/timing.py``).
Specs without both fields (every built-in GPU/TPU spec) skip this pass: device allocators
there keep their pools across runs. Temporaries of while bodies, conditionals and calls
are not walked (they would fault only in a loop's first iteration): an underestimate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..hlo import Instruction, Module
from ..hlo.opcodes import names
from .traffic import FREE_OPCODES

__all__ = ["FirstTouch", "first_touch_pass"]

# Opcodes whose result is (part of) an operand's buffer, not a new buffer.
_ALIAS_OPCODES = names(aliases_operand=True)  # hlo/opcodes.py


@dataclass
class FirstTouch:
    """First-touch bytes of one program run.

    Attributes:
      rows: (computation, instruction name) -> bytes it writes into freshly mapped pages.
      temp_high_water_bytes: H, the simulated temp allocation (bytes).
      temp_fresh: whether H >= the spec's ``mmap_threshold_bytes`` (its pages fault each run).
      output_fresh_bytes: bytes of result leaves counted as fresh allocations.
      applied: False when the spec lacks ``first_touch_bytes_per_s`` or ``mmap_threshold_bytes``.
      notes: how the figures were derived.
    """

    rows: dict[tuple[str, str], int] = field(default_factory=dict)
    temp_high_water_bytes: int = 0
    temp_fresh: bool = False
    output_fresh_bytes: int = 0
    applied: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(self.rows.values())


def _output_bytes(instr: Instruction) -> int:
    return sum(leaf.byte_size for leaf in instr.shape.leaves() if leaf.is_array)


def first_touch_pass(analysis, spec, order: list[Instruction]) -> FirstTouch:
    """First-touch bytes per ENTRY instruction (module docstring).

    Args:
      analysis: a pipeline ModuleAnalysis (its rows give in-place bytes per instruction).
      spec: a HardwareSpec; the pass applies only with ``first_touch_bytes_per_s`` and
        ``mmap_threshold_bytes`` set (CPU specs written by ``jaxmove calibrate``).
      order: the ENTRY computation's instructions in schedule order.
    """
    threshold = spec.mmap_threshold_bytes
    if not spec.first_touch_bytes_per_s or not threshold:
        return FirstTouch()
    module: Module = analysis.module
    entry = module.entry
    inplace = {r.instr.name: r.traffic.inplace_buffer_bytes
               for r in analysis.rows if r.computation == entry.name}

    # Underlying buffers of every value (a value aliasing its operands maps to theirs).
    buffers: dict[str, set[str]] = {}
    new_bytes: dict[str, int] = {}
    for instr in order:
        op = instr.opcode
        if op == "parameter" or op == "constant":
            buffers[instr.name] = set()  # not temp: argument / constant allocations
            continue
        under: set[str] = set()
        if op in _ALIAS_OPCODES:
            for o in instr.operands:
                under |= buffers.get(o, set())
            buffers[instr.name] = under
            continue
        n = 0 if op in FREE_OPCODES else max(0, _output_bytes(instr) - inplace.get(instr.name, 0))
        if inplace.get(instr.name) and instr.operands:
            under |= buffers.get(instr.operands[0], set())
        if n:
            under.add(instr.name)
            new_bytes[instr.name] = n
        buffers[instr.name] = under

    root = entry.root
    live_out = set(buffers.get(root.name, set()))
    aliased = {out_idx for pairs in module.input_output_alias.values() for out_idx, _p in pairs}
    index = {i.name: k for k, i in enumerate(order)}
    last_use: dict[str, int] = {}
    for instr in order:
        for o in instr.operands:
            for b in buffers.get(o, ()):
                last_use[b] = max(last_use.get(b, -1), index[instr.name])

    # Result leaves: one allocation each; fresh when large and not donated.
    out = FirstTouch(applied=True)
    leaf_producers: list[tuple[tuple[int, ...], str]] = []
    if root.opcode == "tuple":
        for k, o in enumerate(root.operands):
            leaf_producers.extend(((k,), b) for b in buffers.get(o, ()))
    else:
        leaf_producers.extend(((), b) for b in buffers.get(root.name, ()))
    for idx, b in leaf_producers:
        nb = new_bytes.get(b, 0)
        if nb >= threshold and idx not in aliased:
            out.rows[(entry.name, b)] = out.rows.get((entry.name, b), 0) + nb
            out.output_fresh_bytes += nb

    frees: dict[int, list[str]] = {}
    for b, k in last_use.items():
        if b not in live_out:
            frees.setdefault(k, []).append(b)
    live = high = 0
    pushes: dict[str, int] = {}
    for k, instr in enumerate(order):
        n = new_bytes.get(instr.name, 0)
        if n and instr.name not in live_out:
            live += n
            if live > high:
                pushes[instr.name] = live - high
                high = live
            if instr.name not in last_use:  # never used: freed at once
                live -= n
        for b in frees.get(k, ()):
            live -= new_bytes.get(b, 0)
    out.temp_high_water_bytes = high
    out.temp_fresh = high >= threshold
    if out.temp_fresh:
        for name, n in pushes.items():
            out.rows[(entry.name, name)] = out.rows.get((entry.name, name), 0) + n
        out.notes.append(
            f"first touch: simulated temp allocation {high} bytes >= mmap threshold {threshold}: its pages "
            f"are mapped fresh each run; {out.total_bytes} first-touch bytes at "
            f"{spec.first_touch_bytes_per_s:.4g} B/s (passes/first_touch.py)")
    elif out.rows:
        out.notes.append(f"first touch: {out.output_fresh_bytes} bytes of large results are freshly "
                         f"mapped each run (passes/first_touch.py)")
    return out
