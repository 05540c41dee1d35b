"""The XLA compiler's own figures for a program, to set beside jaxmove's.

Two sources, both written by XLA itself:

- ``compiled.cost_analysis()`` (XLA's ``HloCostAnalysis``; on TPU the TPU compiler's
  subclass): program ``flops``, ``transcendentals``, ``bytes accessed`` and, on TPU,
  ``optimal_seconds``. XLA:GPU gives none on a deviceless compile (``None``), an HLO file
  has none. Two properties of XLA's figures that jaxmove's do not share
  (xla/service/hlo_cost_analysis.cc): ``HandleWhile`` counts a while body **once** ("for now
  compute the cost of a single iteration"), and ``HandleCustomCall`` sets flops, bytes
  accessed and optimal_seconds to **-1** for a custom call it cannot cost, and that -1 is
  summed into the program's figures (a TPU program with 8 ``ConcatBitcast`` custom calls
  reports ``optimal_seconds`` -7.9997). A negative ``optimal_seconds`` is therefore no time:
  it is reported as None with the reason, never as a number.
- per instruction, XLA:TPU's cost model writes ``estimated_cycles`` into the backend_config
  of each kernel it emits (``backend_config={..."window_config":{..."estimated_cycles":
  "30115"...}}``, a proto int64 printed as a JSON string), for fusions and for the unfused
  kernels (copy, add, reduce...). Cycles become seconds at the TensorCore clock of the spec
  (its ``[target]`` table's ``clock_hz``, with its source); a spec without one (tpu-v6e:
  Google publishes no v6e clock) gives cycles only, and the report says why.

Everything here is read, not modeled: figures XLA does not give are None with a reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["XlaFigures", "XlaInstructionFigures", "fusion_estimated_cycles", "tpu_clock_hz",
           "xla_figures"]

#: the substring every instruction carrying XLA:TPU's cost-model estimate has
_CYCLES_KEY = "estimated_cycles"


def fusion_estimated_cycles(instr) -> int | None:
    """XLA:TPU's ``estimated_cycles`` for one execution of ``instr`` (a fusion or an unfused
    kernel of a TPU program), from its backend_config, or None when it has none.

    Where XLA writes it: ``backend_config.window_config.estimated_cycles`` (a proto int64,
    printed as a JSON string, e.g. ``"30115"``); a top-level ``estimated_cycles`` is read too.

    Args:
      instr: a ``jaxmove.hlo.ir.Instruction`` (anything with a ``backend_config`` dict).
    Returns:
      cycles (int >= 0) per execution, or None (no backend_config, no such key, or a value
      that is not a non-negative integer).
    """
    bc = getattr(instr, "backend_config", None)
    if not isinstance(bc, dict):
        return None
    wc = bc.get("window_config")
    value = wc.get(_CYCLES_KEY) if isinstance(wc, dict) else None
    if value is None:
        value = bc.get(_CYCLES_KEY)
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        cycles = value
    elif isinstance(value, str) and value.strip().isdigit():
        cycles = int(value.strip())
    elif isinstance(value, float) and value.is_integer():
        cycles = int(value)
    else:
        return None
    return cycles if cycles >= 0 else None


def tpu_clock_hz(spec) -> tuple[float | None, str]:
    """(clock in Hz, its source) of a TPU spec's ``[target]`` ``clock_hz``, or (None, why).

    The clock turns XLA:TPU's ``estimated_cycles`` into seconds.
    """
    if spec is None:
        return None, ("no TPU hardware spec: pass --target tpu-... or --hardware tpu-... to turn "
                      "cycles into seconds")
    if getattr(spec, "kind", None) != "tpu":
        return None, f"{spec.name} is not a TPU spec: XLA:TPU's cycles need a TPU clock"
    clock = (getattr(spec, "target", None) or {}).get("clock_hz")
    if not clock:
        return None, (f"the spec {spec.name} has no [target] clock_hz (no published TensorCore "
                      "clock; see its sources): XLA's estimated_cycles are shown as cycles only")
    sources = getattr(spec, "sources", {}) or {}
    return float(clock), str(sources.get("target.clock_hz", "spec [target] clock_hz"))


@dataclass(frozen=True)
class XlaInstructionFigures:
    """XLA:TPU's own estimate for one kernel-level instruction.

    Attributes:
      estimated_cycles: cycles per execution (backend_config ``estimated_cycles``).
      executions: executions per program run (jaxmove's multiplicity: trip counts).
      estimated_s: seconds per program run, ``estimated_cycles * executions / clock_hz``;
        None without a clock.
    """

    estimated_cycles: int
    executions: int
    estimated_s: float | None

    def to_json(self) -> dict:
        return {"estimated_cycles": self.estimated_cycles, "executions": self.executions,
                "estimated_s": self.estimated_s}


@dataclass(frozen=True)
class XlaFigures:
    """The compiler's own figures of one program (module docstring).

    Attributes:
      backend: the program's backend.
      cost_analysis_available: ``compiled.cost_analysis()`` gave figures.
      flops, transcendentals, bytes_accessed, bytes_accessed_output: cost_analysis figures
        (per device, one program run, while bodies counted once), or None.
      optimal_seconds: cost_analysis ``optimal_seconds`` (TPU), None when absent or negative
        (then ``optimal_seconds_reported`` holds XLA's value and ``notes`` says why).
      optimal_seconds_reported: XLA's value as given (may be negative), or None.
      estimated_cycles: sum over instructions of cycles x executions per program run (rows
        inside conditional branches left out, see notes), or None when none has cycles.
      estimated_s: ``estimated_cycles / clock_hz``, or None.
      estimated_instructions: instructions that carry ``estimated_cycles``.
      clock_hz, clock_source: the TensorCore clock used, or None and why.
      custom_calls: kernel-level custom calls (XLA's cost analysis counts -1 for those it
        cannot cost).
      notes: what a reader must know to compare these with jaxmove's figures.
      rows: (computation, instruction name) -> XlaInstructionFigures.
    """

    backend: str
    cost_analysis_available: bool
    flops: float | None = None
    transcendentals: float | None = None
    bytes_accessed: float | None = None
    bytes_accessed_output: float | None = None
    optimal_seconds: float | None = None
    optimal_seconds_reported: float | None = None
    estimated_cycles: int | None = None
    estimated_s: float | None = None
    estimated_instructions: int = 0
    clock_hz: float | None = None
    clock_source: str | None = None
    custom_calls: int = 0
    notes: tuple[str, ...] = ()
    rows: dict = field(default_factory=dict)

    def row(self, computation: str, name: str) -> XlaInstructionFigures | None:
        return self.rows.get((computation, name))

    def to_json(self) -> dict:
        """The report JSON's program-level ``xla`` object (keys may be added, never removed)."""
        return {"backend": self.backend, "cost_analysis_available": self.cost_analysis_available,
                "flops": self.flops, "transcendentals": self.transcendentals,
                "bytes_accessed": self.bytes_accessed,
                "bytes_accessed_output": self.bytes_accessed_output,
                "optimal_seconds": self.optimal_seconds,
                "optimal_seconds_reported": self.optimal_seconds_reported,
                "estimated_cycles": self.estimated_cycles, "estimated_s": self.estimated_s,
                "estimated_instructions": self.estimated_instructions,
                "clock_hz": self.clock_hz, "clock_source": self.clock_source,
                "custom_calls": self.custom_calls, "notes": list(self.notes)}


def _num(d: dict, key: str) -> float | None:
    v = d.get(key)
    try:
        return float(v) if v is not None else None
    except (TypeError, ValueError):
        return None


def xla_figures(analysis, cost_analysis: dict | None, backend: str, clock_spec=None,
                source: str = "", hlo_text: str | None = None) -> XlaFigures:
    """The compiler's figures of an analysed program (module docstring).

    Args:
      analysis: the passes' ``ModuleAnalysis`` (its rows give instructions and executions).
      cost_analysis: ``compiled.cost_analysis()`` as a dict (``Program.xla_cost_analysis``),
        or None.
      backend: ``cpu`` | ``gpu`` | ``tpu`` | ``unknown``.
      clock_spec: the TPU spec whose ``[target]`` ``clock_hz`` turns cycles into seconds
        (the target's spec, else the ``--hardware`` spec), or None.
      source: the program's source (``hlo:...`` for files), for the notes.
      hlo_text: the module's text, when at hand: without the string ``estimated_cycles`` in it
        no instruction is searched (splitting every instruction's attributes costs as much as
        the passes on a large module).
    Returns:
      XlaFigures; figures XLA does not give are None, with a note saying why.
    """
    notes: list[str] = []
    rows = analysis.rows
    custom = [r for r in rows if r.instr.opcode == "custom-call"]
    kw: dict = {}
    if cost_analysis:
        ca = dict(cost_analysis)
        kw = {"flops": _num(ca, "flops"), "transcendentals": _num(ca, "transcendentals"),
              "bytes_accessed": _num(ca, "bytes accessed"),
              "bytes_accessed_output": _num(ca, "bytes accessedout{}")}
        opt = _num(ca, "optimal_seconds")
        kw["optimal_seconds_reported"] = opt
        if opt is not None and opt < 0:
            targets = sorted({r.instr.custom_call_target or "?" for r in custom})
            notes.append(
                f"XLA's optimal_seconds is {opt:.6g}, no time: its cost analysis counts -1 s for each "
                f"instruction it cannot cost (xla/service/hlo_cost_analysis.cc HandleCustomCall) and "
                f"sums them; this program has {len(custom)} custom-call(s)"
                + (f" ({', '.join(targets[:4])})" if targets else "") + "; not shown")
            opt = None
        elif custom:
            notes.append(f"XLA's cost analysis may count -1 (flops, bytes, seconds) for each of the "
                         f"{len(custom)} custom-call(s) it cannot cost (hlo_cost_analysis.cc "
                         "HandleCustomCall): its totals may be low by that much")
        kw["optimal_seconds"] = opt
        if "optimal_seconds" not in ca:
            notes.append(f"XLA:{backend.upper()}'s cost_analysis() gives no optimal_seconds (only "
                         "XLA:TPU's does)")
        if kw["bytes_accessed"] is not None:
            notes.append("XLA's 'bytes accessed' is HloCostAnalysis's sum of operand and output bytes "
                         "of every kernel by its own rules, not HBM traffic alone (it does not separate "
                         "HBM from on-chip memory); jaxmove's HBM bytes leave on-chip (VMEM/SMEM) "
                         "operands out and read sliced operands for their footprint")
        if any(r.instr.opcode == "while" for r in rows):
            notes.append("XLA's cost_analysis counts each while body once (hlo_cost_analysis.cc "
                         "HandleWhile: 'the cost of a single iteration'); jaxmove's totals and the "
                         "estimated_cycles sum count every iteration")
    elif backend == "gpu" and not source.startswith("hlo:"):
        notes.append("XLA:GPU gives no cost_analysis() for a program compiled without the device "
                     "(it returns None): no compiler figures to compare")
    elif source.startswith("hlo:"):
        notes.append("an HLO file carries no cost_analysis() (only a compiled executable has one)")
    else:
        notes.append(f"no cost_analysis() from XLA:{backend.upper()} for this program")

    clock, clock_source = None, None
    per_row: dict = {}
    total_cycles = 0
    in_branch = 0
    # only XLA:TPU writes estimated_cycles (capture/program.py infer_backend marks a file that
    # has them as tpu): other backends' rows are not searched
    search = backend in ("tpu", "unknown") and (hlo_text is None or _CYCLES_KEY in hlo_text)
    for r in rows if search else ():
        bc_text = r.instr.attrs.get("backend_config")
        cycles = fusion_estimated_cycles(r.instr) if bc_text and _CYCLES_KEY in bc_text else None
        if cycles is None:
            continue
        per_row[(r.computation, r.instr.name)] = (cycles, r.multiplicity.count)
        if r.multiplicity.branch_of is not None:
            in_branch += 1
        else:
            total_cycles += cycles * r.multiplicity.count
    out_rows: dict = {}
    if per_row:
        clock, why = tpu_clock_hz(clock_spec)
        if clock is None:
            notes.append(f"estimated_cycles without seconds: {why}")
        else:
            clock_source = why
        for key, (cycles, n) in per_row.items():
            out_rows[key] = XlaInstructionFigures(cycles, n, cycles * n / clock if clock else None)
        if in_branch:
            notes.append(f"{in_branch} instruction(s) with estimated_cycles inside conditional branches "
                         "are listed per row but left out of the program's estimated_cycles")
    elif backend == "tpu":
        notes.append("no instruction carries XLA:TPU's estimated_cycles")
    return XlaFigures(
        backend=backend, cost_analysis_available=bool(cost_analysis), **kw,
        estimated_cycles=total_cycles if per_row else None,
        estimated_s=(total_cycles / clock if per_row and clock else None),
        estimated_instructions=len(per_row), clock_hz=clock, clock_source=clock_source,
        custom_calls=len(custom), notes=tuple(notes), rows=out_rows)
