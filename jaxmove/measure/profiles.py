"""Profiles captured elsewhere: read them, pick a program, get its HLO.

``read_capture(path)`` reads what people capture on GPUs and TPUs away from jaxmove:

- **xplane**: an XProf profile directory (``plugins/profile/<run>/*.xplane.pb``, the newest
  run) or one ``.xplane.pb`` file (``xplane.py``). The ``/host:metadata`` plane carries each
  program's optimized HloProto.
- **trace-json**: the trace-viewer / Perfetto JSON that ``jax.profiler.trace`` writes beside the
  xplane (``*.trace.json.gz``, ``perfetto_trace.json.gz``), gzipped or not. It carries no HLO:
  give ``--hlo``.
- **nsys-jax**: an archive (``.zip``) or directory made by NVIDIA's nsys-jax: NVTX thunk ranges
  projected onto the GPU timeline (``nvtx_gpu_proj_trace/trace.parquet``, read with pyarrow) and
  the binary HloProto dumps (``dump/module_NNNN.<name>.*after_optimizations.hlo.pb[.xz]``; NNNN
  is the program id).

Every reader returns a ``Capture``: per program (program id and HloModule name) the events of
one device with the HLO instruction they executed (``hlo_op``) and the program execution they
belong to (``run_id``), so that ``join_events`` sums them per instruction per execution:

- GPU kernels (xplane, trace-json): a device-plane kernel event names ``hlo_op`` /
  ``hlo_module`` / ``program_id``; its execution is found through its ``correlation_id``: the host
  launch call (``hipModuleLaunchKernel``, ``cuLaunchKernel``, ...) with the same id lies inside one
  ``<module>:XLA GPU module`` host range, which XLA:GPU's executable opens once per execution
  (``xla/service/gpu/gpu_executable.cc``). Kernels of one instruction (a convolution's im2col and
  gemm, split-K gemm and reduction) add up in the join.
- XLA:CPU thunks (xplane, trace-json): host events with ``hlo_op`` and a ``run_id`` per execution
  (``profile.py``).
- Device planes without such kernel events but with XProf's ``XLA Modules`` and ``XLA Ops`` lines
  (TPU captures): each ``XLA Modules`` event is one execution and the ``XLA Ops`` events inside it
  are its instructions (``XLA Ops`` nest a ``while``'s body inside the ``while``: the join charges
  control flow exclusive of its body).
- nsys-jax: each ``TSL:XlaModule:#hlo_module=NAME,program_id=N#`` range is one execution; the
  ``TSL:Thunk:#...hlo_op=OP#`` ranges whose nearest enclosing XlaModule range it is belong to it.
  A thunk range that encloses other thunk ranges (a ``while`` or a command buffer) is charged only
  the time none of them covers, so nothing is counted twice.

Several devices: the estimate is per device, so the events of one device are kept (the lowest
ordinal that ran the program); the others are counted in ``CaptureProgram.n_devices``.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import lzma
import math
import os
import re
import zipfile
from bisect import bisect_right
from dataclasses import dataclass, field

from .profile import TraceEvent
from .xplane import CaptureFormatError, XPlaneEvent, parse_xspace

__all__ = ["FORMATS", "Capture", "CaptureProgram", "CaptureFormatError", "detect_format",
           "read_capture", "select_program", "program_hlo_text"]

#: The formats ``read_capture`` reads.
FORMATS = ("xplane", "trace-json", "nsys-jax")

# Lines XProf derives from a device plane's stream lines (their events repeat the kernels').
_DERIVED_LINES = frozenset({"XLA Ops", "XLA Modules", "Steps", "Framework Ops", "Framework Name Scope",
                            "Source code", "Launch Stats", "XLA TraceMe", "TensorFlow Ops",
                            "Async XLA Ops"})
_DEVICE_ORDINAL = re.compile(r"^/device:[A-Za-z_]+:(\d+)")
_GPU_MODULE_RANGE = ":XLA GPU module"  # TraceMe name XLA:GPU's executable opens per execution


@dataclass
class CaptureProgram:
    """One program seen in a capture.

    Attributes:
      program_id: XLA's program id (None when the capture records none).
      module_name: the HloModule name (``jit_f``).
      events: its events on the device kept, ``TraceEvent`` with ``run_id`` = execution index
        (None where the execution could not be told), durations in ns.
      runs: distinct executions identified (0 when none could be told apart).
      device: the device kept (``/device:GPU:0``, ``/host:CPU``, ``GPU 0 (rank 0)``).
      n_devices: devices that ran it in the capture.
      exclusive: the event durations are already exclusive of nested events.
      device_time_s: sum of its event durations on the device kept, seconds (all executions).
      hlo_proto: the serialized HloProto the capture carries, or None.
      hlo_where: where that proto came from, for messages.
    """

    program_id: int | None
    module_name: str
    events: list[TraceEvent]
    runs: int
    device: str
    n_devices: int = 1
    exclusive: bool = False
    device_time_s: float = 0.0
    hlo_proto: bytes | None = None
    hlo_where: str = ""

    @property
    def label(self) -> str:
        return self.module_name if self.program_id is None else f"{self.module_name} (program {self.program_id})"


@dataclass
class Capture:
    """What a capture holds.

    Attributes:
      path: the file or directory read.
      format: one of ``FORMATS``.
      programs: every program with events or an HloProto, most device time first.
      device_kind: the device's name when the capture records it (``NVIDIA A100-SXM4-40GB``), or
        one derived from the recorded vendor / compute capability / cores (``AMD Instinct MI300X``),
        else None.
      device_info: what the capture says of the device (vendor, cores, clock...).
      backend: ``gpu`` | ``cpu`` | ``tpu`` (where the events ran).
      outside_s: device event name -> seconds (whole capture) of device events that name no
        program (argument copies, memsets outside an execution).
      notes: caveats of the reading.
    """

    path: str
    format: str
    programs: list[CaptureProgram]
    device_kind: str | None = None
    device_info: dict = field(default_factory=dict)
    backend: str = "gpu"
    outside_s: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- format

def _magic(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(4)


def detect_format(path: str | os.PathLike) -> tuple[str, str]:
    """(format, file or directory to read) for PATH.

    A directory is an nsys-jax output (``nvtx_gpu_proj_trace/trace.parquet``) or holds XProf
    profiles (the newest ``*.xplane.pb`` under it), else trace-viewer JSON (``*.trace.json.gz``,
    ``perfetto_trace.json.gz``). A file is recognised by its name, then by its first bytes (zip,
    gzip, ``{`` / ``[``).

    Raises:
      FileNotFoundError: PATH does not exist.
      CaptureFormatError: nothing jaxmove reads (the message lists what it looked for).
    """
    p = os.fspath(path)
    if not os.path.exists(p):
        raise FileNotFoundError(p)
    if os.path.isdir(p):
        if os.path.isfile(os.path.join(p, "nvtx_gpu_proj_trace", "trace.parquet")):
            return "nsys-jax", p
        xs = glob.glob(os.path.join(p, "**", "*.xplane.pb"), recursive=True)
        if xs:
            return "xplane", max(xs, key=os.path.getmtime)
        js = [f for pat in ("*.trace.json.gz", "*.trace.json", "perfetto_trace.json.gz", "*.json.gz")
              for f in glob.glob(os.path.join(p, "**", pat), recursive=True)]
        if js:
            return "trace-json", max(js, key=os.path.getmtime)
        raise CaptureFormatError(f"{p}: no profile found in the directory (looked for *.xplane.pb, "
                                 "*.trace.json[.gz], perfetto_trace.json.gz, nsys-jax's "
                                 "nvtx_gpu_proj_trace/trace.parquet)")
    low = p.lower()
    head = _magic(p)
    if low.endswith(".xplane.pb"):
        return "xplane", p
    if low.endswith((".json", ".json.gz")):
        return "trace-json", p
    if head.startswith(b"PK\x03\x04") or low.endswith(".zip"):
        return "nsys-jax", p
    if head.startswith(b"\x1f\x8b"):
        return "trace-json", p
    if head[:1] in (b"{", b"["):
        return "trace-json", p
    if low.endswith(".pb"):
        return "xplane", p
    raise CaptureFormatError(f"{p}: not a profile format jaxmove reads (expected an XProf .xplane.pb or "
                             "profile directory, a jax.profiler trace JSON (.json / .json.gz), or an "
                             "nsys-jax archive (.zip) / directory)")


def read_capture(path: str | os.PathLike) -> Capture:
    """Read the capture at PATH (any of ``FORMATS``; ``detect_format``).

    Raises:
      FileNotFoundError; CaptureFormatError: unknown format, truncated or malformed file, or
      no event that names an HLO module.
    """
    fmt, where = detect_format(path)
    if fmt == "xplane":
        with open(where, "rb") as f:
            data = f.read()
        space = parse_xspace(data, where)
        cap = _from_events(where, "xplane", space.events, space.plane_stats)
        siblings = sorted(glob.glob(os.path.join(os.path.dirname(where), "*.xplane.pb")))
        if os.path.isdir(os.fspath(path)) and len(siblings) > 1:
            cap.notes.append(f"{len(siblings)} .xplane.pb files (hosts) in {os.path.dirname(where)}; only "
                             f"{os.path.basename(where)} is read (pass another file to read its host)")
        for pid, (name, proto) in space.programs.items():
            prog = next((q for q in cap.programs if q.program_id == pid), None)
            if prog is None:
                prog = CaptureProgram(pid, name, [], 0, "", 0)
                cap.programs.append(prog)
            prog.hlo_proto, prog.hlo_where = proto, f"{where}: program {pid} ({name})"
    elif fmt == "trace-json":
        cap = _from_events(where, "trace-json", _read_trace_json(where), {})
    else:
        cap = _read_nsys(where)
    if not any(q.events for q in cap.programs):
        raise CaptureFormatError(f"{where}: the {fmt} capture holds no event that names an HLO "
                                 "instruction (hlo_op) of a program: nothing to join")
    cap.programs.sort(key=lambda q: (-q.device_time_s, q.program_id if q.program_id is not None else -1,
                                     q.module_name))
    return cap


# ----------------------------------------------------------------------------- events -> programs

def _int(v):
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _device_kind(stats: dict) -> tuple[str | None, dict]:
    """The device kind a device plane's stats imply (see Capture.device_kind)."""
    info = {k: stats[k] for k in ("device_vendor", "core_count", "clock_rate", "memory_bandwidth",
                                  "memory_size", "compute_cap_major", "compute_cap_minor",
                                  "device_type_string") if k in stats}
    vendor = str(stats.get("device_vendor", "")).lower()
    cc = (stats.get("compute_cap_major"), stats.get("compute_cap_minor"))
    cores = stats.get("core_count")
    # AMD: compute capability = the gfx IP version (gfx942 -> 9.4); CU counts from ROCm's GPU
    # specifications table (MI300X 304, MI355X 256).
    if vendor == "amd" and cc == (9, 4) and cores == 304:
        return "AMD Instinct MI300X", info
    if vendor == "amd" and cc == (9, 5) and cores == 256:
        return "AMD Instinct MI355X", info
    # otherwise the built-in spec of this vendor with as many SMs / CUs and the nearest memory
    # size (within 25%: drivers report a little less or more than the datasheet's GB), e.g. an
    # NVIDIA plane with 132 SMs and 85 GB is an H100 80GB, with 150 GB an H200
    mem = stats.get("memory_size")
    if vendor and cores and mem:
        from ..hardware import list_specs
        best = None
        for spec in list_specs():
            cap = getattr(spec, "hbm_capacity_bytes", None)
            if (spec.kind == "gpu" and spec.vendor.lower() == vendor and getattr(spec, "num_sms", None) == cores
                    and cap and abs(mem / cap - 1) < 0.25 and spec.device_kinds):
                if best is None or abs(mem / cap - 1) < abs(mem / best.hbm_capacity_bytes - 1):
                    best = spec
        if best is not None:
            return best.device_kinds[0], info
    return None, info


def _from_events(path: str, fmt: str, events: list[XPlaneEvent], plane_stats: dict) -> Capture:
    on_dev = [e for e in events if e.plane.startswith("/device:") and e.line not in _DERIVED_LINES]
    if any("hlo_module" in e.stats for e in on_dev):
        on_dev = _annotate_from_launches(on_dev, events)
    kernels = [e for e in on_dev if "hlo_module" in e.stats]
    cap = Capture(path, fmt, [])
    if kernels:
        first = min({e.plane for e in kernels}, key=lambda n: _int((_DEVICE_ORDINAL.match(n) or [0, 0])[1]) or 0)
        cap.device_kind, cap.device_info = _device_kind(plane_stats.get(first, {}))
        cap.backend = "tpu" if first.startswith("/device:TPU") else "gpu"
        bare = [e for e in on_dev if "hlo_module" not in e.stats]
        runs = _runs_by_launch(kernels + bare, [e for e in events if not e.plane.startswith("/device:")])
        # a kernel that names no instruction but was launched inside an execution of a program
        # (same execution range) is that program's device time, not joined to an instruction
        owner = {}
        for e in kernels:
            rk = runs.get(id(e))
            if rk is not None:
                owner.setdefault((e.plane, rk), (e.stats.get("program_id"), e.stats["hlo_module"]))
        for e in bare:
            o = owner.get((e.plane, runs.get(id(e))))
            if o is not None and runs.get(id(e)) is not None:
                st = dict(e.stats)
                st["hlo_module"] = o[1]
                if o[0] is not None:
                    st["program_id"] = o[0]
                kernels.append(XPlaneEvent(e.plane, e.line, e.name, e.start_ns, e.duration_ns, st))
                runs[id(kernels[-1])] = runs[id(e)]
            elif e.duration_ns > 0:
                cap.outside_s[e.name] = cap.outside_s.get(e.name, 0.0) + e.duration_ns * 1e-9
    elif _xla_ops_planes(events):
        kernels, runs = _from_xla_ops_lines(events)
        first = min({e.plane for e in kernels}, key=lambda n: _int((_DEVICE_ORDINAL.match(n) or [0, 0])[1]) or 0)
        cap.device_kind, cap.device_info = _device_kind(plane_stats.get(first, {}))
        cap.backend = "tpu" if first.startswith("/device:TPU") else "gpu"
        cap.notes.append("device ops read from XProf's 'XLA Ops' / 'XLA Modules' lines (each 'XLA Modules' "
                         "event is one execution; an op belongs to the one its start lies in)")
    else:
        kernels = [e for e in events if "hlo_module" in e.stats and "hlo_op" in e.stats]
        cap.backend = "cpu" if any(e.plane.startswith("/host:") for e in kernels) else "gpu"
        if cap.backend == "cpu":
            cap.device_kind = "cpu"
        runs = {id(e): _int(e.stats.get("run_id")) for e in kernels}
        if any(e.plane.startswith("/device:") for e in events) and not kernels:
            cap.notes.append("device planes hold no event naming an HLO module")
    groups: dict[tuple, list[XPlaneEvent]] = {}
    for e in kernels:
        key = (_int(e.stats.get("program_id")), str(e.stats["hlo_module"]))
        groups.setdefault(key, []).append(e)
    plane_ordinal: dict[str, int | None] = {}

    def ordinal(e):
        o = plane_ordinal.get(e.plane, -1)
        if o == -1:
            m = _DEVICE_ORDINAL.match(e.plane)
            o = plane_ordinal[e.plane] = int(m.group(1)) if m else None
        return o if o is not None else (_int(e.stats.get("device_ordinal")) or 0)

    for (pid, mod), evs in groups.items():
        devices = sorted({ordinal(e) for e in evs})
        keep = devices[0]
        mine = [e for e in evs if ordinal(e) == keep]
        run_keys: dict[object, int] = {}
        out = []
        for e in sorted(mine, key=lambda e: e.start_ns):
            rk = runs.get(id(e))
            rid = None
            if rk is not None:
                rid = run_keys.setdefault(rk, len(run_keys))
            op = e.stats.get("hlo_op")
            out.append(TraceEvent(mod, str(op) if op is not None else None, e.name, e.start_ns,
                                  e.duration_ns, rid, keep, e.plane, e.line))
        plane = mine[0].plane
        cap.programs.append(CaptureProgram(
            pid, mod, out, len(run_keys), plane if plane.startswith("/device:") else f"{plane} (device {keep})",
            len(devices), False, sum(e.duration_ns for e in mine) * 1e-9))
    return cap


_MODULE_EVENT = re.compile(r"^(.*)\((\d+)\)$")  # 'jit_f(12)': HloModule name, then the program id


def _xla_ops_planes(events: list[XPlaneEvent]) -> set[str]:
    """Device planes that hold both an 'XLA Modules' and an 'XLA Ops' line (TPU captures keep a
    device's executions and HLO ops there)."""
    lines: dict[str, set[str]] = {}
    for e in events:
        if e.plane.startswith("/device:"):
            lines.setdefault(e.plane, set()).add(e.line)
    return {p for p, ls in lines.items() if {"XLA Modules", "XLA Ops"} <= ls}


def _from_xla_ops_lines(events: list[XPlaneEvent]) -> tuple[list[XPlaneEvent], dict[int, object]]:
    """Kernels and execution keys from 'XLA Ops' / 'XLA Modules' lines: an 'XLA Modules' event
    (name ``module(program id)``, or stats ``hlo_module`` / ``program_id``) is one execution; an
    'XLA Ops' event (the HLO instruction's name, or an ``hlo_op`` stat) belongs to the execution
    on its plane whose interval holds its start. Ops inside no execution are left out."""
    planes = _xla_ops_planes(events)
    mods: dict[str, list[XPlaneEvent]] = {}
    ops: list[XPlaneEvent] = []
    for e in events:
        if e.plane in planes and e.line == "XLA Modules":
            mods.setdefault(e.plane, []).append(e)
        elif e.plane in planes and e.line == "XLA Ops":
            ops.append(e)
    starts = {}
    for p, ms in mods.items():
        ms.sort(key=lambda e: e.start_ns)
        starts[p] = [e.start_ns for e in ms]
    kernels, runs = [], {}
    for e in ops:
        i = bisect_right(starts[e.plane], e.start_ns) - 1
        if i < 0:
            continue
        m = mods[e.plane][i]
        if not m.start_ns <= e.start_ns <= m.end_ns:
            continue
        hit = _MODULE_EVENT.match(m.name)
        st = dict(e.stats)
        st["hlo_module"] = str(m.stats.get("hlo_module") or (hit.group(1) if hit else m.name))
        pid = m.stats.get("program_id", int(hit.group(2)) if hit else None)
        if pid is not None:
            st["program_id"] = pid
        st.setdefault("hlo_op", e.name)
        k = XPlaneEvent(e.plane, e.line, e.name, e.start_ns, e.duration_ns, st)
        kernels.append(k)
        runs[id(k)] = (e.plane, m.start_ns)
    return kernels, runs


def _annotate_from_launches(on_dev: list[XPlaneEvent], events: list[XPlaneEvent]) -> list[XPlaneEvent]:
    """Device events without ``hlo_module`` take ``hlo_module`` / ``hlo_op`` / ``program_id`` from
    the host launch call with the same ``correlation_id`` when that call carries them (the MI300X
    captures record some kernels of an execution so: an im2col kernel of a convolution)."""
    launches = {}
    for e in events:
        if not e.plane.startswith("/device:") and "correlation_id" in e.stats and "hlo_module" in e.stats:
            launches.setdefault(_int(e.stats["correlation_id"]), e)
    out = []
    for e in on_dev:
        if "hlo_module" not in e.stats and "correlation_id" in e.stats:
            h = launches.get(_int(e.stats["correlation_id"]))
            if h is not None:
                st = dict(e.stats)
                for k in ("hlo_module", "hlo_op", "program_id"):
                    if k in h.stats:
                        st[k] = h.stats[k]
                e = XPlaneEvent(e.plane, e.line, e.name, e.start_ns, e.duration_ns, st)
        out.append(e)
    return out


def _runs_by_launch(kernels: list[XPlaneEvent], host: list[XPlaneEvent]) -> dict[int, object]:
    """id(kernel event) -> execution key: the ``<module>:XLA GPU module`` host range enclosing the
    host launch call that has the kernel's ``correlation_id`` (module docstring)."""
    launches = {}
    for e in host:
        c = e.stats.get("correlation_id")
        if c is not None and not e.name.endswith(_GPU_MODULE_RANGE):
            launches.setdefault(_int(c), e)
    ranges: dict[tuple[str, str], list[XPlaneEvent]] = {}
    for e in host:
        if e.name.endswith(_GPU_MODULE_RANGE):
            ranges.setdefault((e.plane, e.line), []).append(e)
    starts = {}
    for k, rs in ranges.items():
        rs.sort(key=lambda e: e.start_ns)
        starts[k] = [e.start_ns for e in rs]
    def enclosing(rk, t):
        rs = ranges.get(rk)
        if not rs:
            return None
        i = bisect_right(starts[rk], t) - 1
        return rs[i] if i >= 0 and rs[i].start_ns <= t <= rs[i].end_ns else None

    # The launch calls may be recorded on another line than the ranges (ROCm: 'Host
    # Threads/<tid>' for the HIP API, 'py_xla_execute/<id>' for XLA's TraceMe): each launch line
    # is paired with the range line that encloses the most of its launches.
    todo = []
    for k in kernels:
        launch = launches.get(_int(k.stats.get("correlation_id")))
        if launch is not None:
            todo.append((k, launch))
    pair: dict[tuple[str, str], tuple[str, str]] = {}
    votes: dict[tuple[str, str], dict[tuple[str, str], int]] = {}
    for _, launch in todo:
        lk = (launch.plane, launch.line)
        if lk in ranges or lk in pair:
            continue
        v = votes.setdefault(lk, {})
        for rk in ranges:
            if enclosing(rk, launch.start_ns) is not None:
                v[rk] = v.get(rk, 0) + 1
    for lk, v in votes.items():
        if v:
            pair[lk] = max(sorted(v), key=lambda rk: v[rk])
    out: dict[int, object] = {}
    for k, launch in todo:
        lk = (launch.plane, launch.line)
        rk = lk if lk in ranges else pair.get(lk)
        if rk is None:
            continue
        r = enclosing(rk, launch.start_ns)
        if r is not None:
            out[id(k)] = (rk, r.start_ns)
    return out


# ----------------------------------------------------------------------------- trace JSON

def _read_trace_json(path: str) -> list[XPlaneEvent]:
    """The complete (``ph: X``) events of a trace-viewer JSON as XPlaneEvents: plane = the
    process name, line = the thread name (``M`` metadata events), ``ts``/``dur`` (us) -> ns,
    ``args`` -> stats (numeric strings of ids made ints)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        doc = json.loads(raw)
    except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError, json.JSONDecodeError, lzma.LZMAError) as e:
        raise CaptureFormatError(f"{path}: not a readable trace JSON (truncated or another format: {e})") from None
    evs = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(evs, list):
        raise CaptureFormatError(f"{path}: no 'traceEvents' list (not a trace-viewer / Perfetto JSON)")
    procs, threads = {}, {}
    for e in evs:
        if isinstance(e, dict) and e.get("ph") == "M":
            args = e.get("args") or {}
            if e.get("name") == "process_name":
                procs[e.get("pid")] = str(args.get("name", e.get("pid")))
            elif e.get("name") == "thread_name":
                threads[(e.get("pid"), e.get("tid"))] = str(args.get("name", e.get("tid")))
    out = []
    for i, e in enumerate(evs):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        try:
            ts, dur = float(e["ts"]), float(e["dur"])
        except (KeyError, TypeError, ValueError):
            raise CaptureFormatError(f"{path}: traceEvents[{i}]: an 'X' (complete) event without numeric "
                                     "ts and dur (microseconds; the Trace Event Format requires both)") from None
        if not (math.isfinite(ts) and math.isfinite(dur)) or dur < 0:
            raise CaptureFormatError(f"{path}: traceEvents[{i}]: ts {e['ts']!r}, dur {e['dur']!r}: expected "
                                     "finite microseconds and a duration >= 0")
        args = e.get("args")
        if args is not None and not isinstance(args, dict):
            raise CaptureFormatError(f"{path}: traceEvents[{i}]: 'args' is {type(args).__name__}, "
                                     "expected an object of stats")
        stats = dict(args or {})
        for k in ("run_id", "program_id", "correlation_id", "device_ordinal"):
            if k in stats and _int(stats[k]) is not None:
                stats[k] = _int(stats[k])
        pid, tid = e.get("pid"), e.get("tid")
        out.append(XPlaneEvent(procs.get(pid, str(pid)), threads.get((pid, tid), str(tid)),
                               str(e.get("name", "")), ts * 1e3, dur * 1e3, stats))
    return out


# ----------------------------------------------------------------------------- nsys-jax

_NVTX_ARGS = re.compile(r"#(.*)#\s*$")


def _nvtx_args(name: str) -> dict[str, str]:
    """``TSL:Thunk:#name=a/b,hlo_op=fusion.3#`` -> {'name': 'a/b', 'hlo_op': 'fusion.3'}. A value may
    hold commas (op names like ``reduce_sum[axes=(0,)]``): a piece without ``=`` joins the previous."""
    m = _NVTX_ARGS.search(name)
    if not m:
        return {}
    out: dict[str, str] = {}
    last = None
    for piece in m.group(1).split(","):
        k, sep, v = piece.partition("=")
        if sep and re.fullmatch(r"[A-Za-z_]+", k):
            out[k] = v
            last = k
        elif last is not None:
            out[last] += "," + piece
    return out


class _NsysFiles:
    """Files of an nsys-jax archive or directory, by relative path."""

    def __init__(self, path: str):
        self.path = path
        self.zip = None
        if os.path.isdir(path):
            self.names = [os.path.relpath(f, path).replace(os.sep, "/")
                          for f in glob.glob(os.path.join(path, "**", "*"), recursive=True) if os.path.isfile(f)]
        else:
            try:
                self.zip = zipfile.ZipFile(path)
                self.names = self.zip.namelist()
            except (zipfile.BadZipFile, OSError) as e:
                raise CaptureFormatError(f"{path}: not a readable nsys-jax zip archive ({e})") from None

    def read(self, name: str) -> bytes:
        try:
            if self.zip is not None:
                data = self.zip.read(name)
            else:
                with open(os.path.join(self.path, name), "rb") as f:
                    data = f.read()
            if name.endswith(".xz"):
                data = lzma.decompress(data)
            return data
        except (zipfile.BadZipFile, OSError, lzma.LZMAError, EOFError, KeyError) as e:
            raise CaptureFormatError(f"{self.path}: {name}: cannot read ({e})") from None


def _read_nsys(path: str) -> Capture:
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - pyarrow is in the profiles extra
        from ..errors import UsageError
        raise UsageError("reading nsys-jax captures needs pyarrow: pip install 'jaxmove[profiles]'") from None
    files = _NsysFiles(path)
    trace_name = next((n for n in files.names if n.endswith("nvtx_gpu_proj_trace/trace.parquet")), None)
    if trace_name is None:
        raise CaptureFormatError(f"{path}: no nvtx_gpu_proj_trace/trace.parquet (not an nsys-jax output, "
                                 "or made without the GPU projection of the NVTX ranges)")
    try:
        table = pq.read_table(io.BytesIO(files.read(trace_name)))
    except CaptureFormatError:
        raise
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError on a bad file
        raise CaptureFormatError(f"{path}: {trace_name}: not a readable parquet file ({e})") from None
    need = ["Name", "Projected Start", "Projected Duration", "RangeId", "RangeStack"]
    missing = [c for c in need if c not in table.column_names]
    if missing:
        raise CaptureFormatError(f"{path}: {trace_name}: missing column(s) {', '.join(missing)} "
                                 f"(has {', '.join(table.column_names)})")
    cols = {c: table.column(c).to_pylist() for c in need + [c for c in ("Rank", "TID") if c in table.column_names]}
    n = table.num_rows
    ranks = cols.get("Rank") or [0] * n
    rank = min((r for r in ranks if r is not None), default=0)
    modules: dict[int, tuple[str, int | None]] = {}  # range id -> (module, program id)
    thunks = []
    for i in range(n):
        name = cols["Name"][i]
        if not name or ranks[i] != rank or cols["RangeId"][i] is None:
            continue
        rid = int(cols["RangeId"][i])
        if name.startswith("TSL:XlaModule:"):
            a = _nvtx_args(name)
            if "hlo_module" in a:
                modules[rid] = (a["hlo_module"], _int(a.get("program_id")))
        elif name.startswith("TSL:Thunk:"):
            thunks.append(i)
    thunk_ids = {int(cols["RangeId"][i]) for i in thunks}
    by_run: dict[int, list[tuple[int, int | None]]] = {}  # module range id -> [(row, parent thunk id)]
    for i in thunks:
        stack = [int(s) for s in str(cols["RangeStack"][i] or "").split(":") if s.strip().lstrip("-").isdigit()]
        rid = int(cols["RangeId"][i])
        anc = [s for s in stack if s != rid]
        mod = next((s for s in reversed(anc) if s in modules), None)
        if mod is None:
            continue
        after = anc[anc.index(mod) + 1:]
        parent = next((s for s in reversed(after) if s in thunk_ids), None)
        by_run.setdefault(mod, []).append((i, parent))
    progs: dict[tuple[int | None, str], CaptureProgram] = {}
    for mod_rid in sorted(by_run, key=lambda r: min(cols["Projected Start"][i] for i, _ in by_run[r])):
        mname, pid = modules[mod_rid]
        rows = by_run[mod_rid]
        children: dict[int, list[tuple[float, float]]] = {}
        for i, parent in rows:
            if parent is not None:
                s = float(cols["Projected Start"][i])
                children.setdefault(parent, []).append((s, s + float(cols["Projected Duration"][i])))
        prog = progs.get((pid, mname))
        if prog is None:
            prog = progs[(pid, mname)] = CaptureProgram(pid, mname, [], 0, f"GPU of rank {rank}", 1, True)
        run = prog.runs
        prog.runs += 1
        from .profile import _union_ns
        for i, _ in rows:
            rid = int(cols["RangeId"][i])
            s, d = float(cols["Projected Start"][i]), float(cols["Projected Duration"][i])
            excl = d
            if rid in children:  # clipped to the parent's interval, then subtracted
                inner = [(max(a, s), min(b, s + d)) for a, b in children[rid] if b > s and a < s + d]
                excl = max(0.0, d - _union_ns(inner))
            a = _nvtx_args(cols["Name"][i])
            prog.events.append(TraceEvent(mname, a.get("hlo_op"), cols["Name"][i], s, excl, run, rank,
                                          f"GPU (rank {rank})", "NVTX thunks"))
            prog.device_time_s += excl * 1e-9
    cap = Capture(path, "nsys-jax", list(progs.values()), backend="gpu")
    if len(set(r for r in ranks if r is not None)) > 1:
        cap.notes.append(f"the capture holds several ranks; rank {rank} is used")
    # device name: device-metadata.parquet, column ('TARGET_INFO_GPU', 'name')
    meta = next((nm for nm in files.names if nm.endswith("device-metadata.parquet")), None)
    if meta is not None:
        try:
            t = pq.read_table(io.BytesIO(files.read(meta)))
            col = next((c for c in t.column_names if "TARGET_INFO_GPU" in c and c.endswith("'name')")), None)
            if col is not None:
                names = [v for v in t.column(col).to_pylist() if v]
                if names:
                    cap.device_kind = str(names[0])
        except Exception:  # the device name is optional: an unreadable table leaves it unknown
            cap.notes.append(f"{meta}: unreadable; the device is not named")
    # HloProto dumps: dump/module_NNNN.<name>.<...>after_optimizations.hlo.pb[.xz]
    dump = re.compile(r"(?:^|/)module_(\d+)\.([^/]+?)\.(?:[^/]*\.)?[^/.]*after_optimizations\.hlo\.pb(?:\.xz)?$")
    for nm in files.names:
        m = dump.search(nm)
        if not m:
            continue
        pid, mname = int(m.group(1)), m.group(2)
        prog = progs.get((pid, mname))
        if prog is None:
            continue
        prog.hlo_proto = None
        prog.hlo_where = f"{path}: {nm}"
        prog._loader = (files, nm)  # read lazily: the step's dump is MBs of xz
    return cap


# ----------------------------------------------------------------------------- selection

def select_program(cap: Capture, program: str | int | None = None, hlo_module: str | None = None) -> CaptureProgram:
    """The program to compare.

    Args:
      program: a program id (int or digits) or an HloModule name; None: the program named
        ``hlo_module`` when given, else the one with the most device time.
      hlo_module: the module name of the HLO given with ``--hlo``.

    Raises:
      CaptureFormatError: no such program, a name several programs share (the message lists
        their ids), or an HLO whose module name no program of the capture has.
    """
    with_events = [q for q in cap.programs if q.events]

    def listing(progs):
        return ", ".join(q.label for q in progs[:12]) + (f" and {len(progs) - 12} more" if len(progs) > 12 else "")

    if program is not None:
        s = str(program).strip()
        if s.lstrip("-").isdigit():
            hits = [q for q in cap.programs if q.program_id == int(s)]
        else:
            hits = [q for q in cap.programs if q.module_name == s]
        hits = [q for q in hits if q.events] or hits
        if not hits:
            raise CaptureFormatError(f"{cap.path}: no program '{s}' in the capture; programs with events: "
                                     f"{listing(with_events)}")
        if len(hits) > 1:
            hits_ev = [q for q in hits if q.events]
            raise CaptureFormatError(f"{cap.path}: {len(hits)} programs are named '{s}' "
                                     f"({', '.join(str(q.program_id) for q in hits_ev or hits)}); "
                                     "pick one with --program ID")
        return hits[0]
    if hlo_module is not None:
        hits = [q for q in with_events if q.module_name == hlo_module]
        if not hits:
            raise CaptureFormatError(f"{cap.path}: the capture has no program of HLO module '{hlo_module}' "
                                     f"(the --hlo file's); programs with events: {listing(with_events)}; "
                                     "--program NAME|ID picks one regardless")
        if len(hits) > 1:
            raise CaptureFormatError(f"{cap.path}: {len(hits)} programs of the capture are of HLO module "
                                     f"'{hlo_module}' ({', '.join(str(q.program_id) for q in hits)}); "
                                     "pick the one the --hlo file is with --program ID")
        return hits[0]
    return with_events[0]


def program_hlo_text(prog: CaptureProgram) -> str | None:
    """HLO text of the program's HloProto from the capture, None when it carries none.

    Raises:
      CaptureFormatError: the proto cannot be read.
    """
    from .hloproto import hlo_text_from_proto

    loader = getattr(prog, "_loader", None)
    if prog.hlo_proto is None and loader is not None:
        files, name = loader
        prog.hlo_proto = files.read(name)
    if prog.hlo_proto is None:
        return None
    return hlo_text_from_proto(prog.hlo_proto, prog.hlo_where)
