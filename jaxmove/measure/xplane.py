"""XProf ``.xplane.pb`` files: the profile planes and the HloProtos a capture carries.

An xplane file is a serialized ``tensorflow.profiler.XSpace`` protobuf (XProf's format). It is
decoded by the ``protobuf`` runtime with the message schema of tsl's
``xla/tsl/profiler/protobuf/xplane.proto`` (messages XSpace, XPlane, XLine, XEvent, XStat,
XEventMetadata, XStatMetadata; field numbers copied from that file), built here as a
``FileDescriptorProto`` because neither jaxlib nor xprof ships the generated ``xplane_pb2``
(xprof's own CLI says so: "xplane_pb2 is not available in OSS"). ``jax.profiler.ProfileData``
reads the planes but not a plane's event metadata, where the ``/host:metadata`` plane keeps the
optimized ``HloProto`` of every program (one XEventMetadata per program: ``id`` = program id,
``name`` = the HloModule name followed by ``(program id)``, a stat ``Hlo Proto`` whose bytes are
the proto; XProf's ``kHloProto`` stat type in ``xla/tsl/profiler/utils/xplane_schema.cc``).

The HloProtos become HLO text in ``hloproto.py``.

Times: ``XLine.timestamp_ns`` + ``XEvent.offset_ps`` is an event's start; ``duration_ps`` its
length (picoseconds).
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field

__all__ = ["XPlaneEvent", "XSpaceData", "CaptureFormatError", "read_xspace_file", "parse_xspace"]

from ..errors import JaxmoveInputError


class CaptureFormatError(JaxmoveInputError):
    """A profile capture that cannot be read: truncated, not of the format it claims, or of
    no format jaxmove reads (the message names the file and what was expected)."""


@dataclass(frozen=True, slots=True)
class XPlaneEvent:
    """One event of a plane line, with its own and its metadata's stats merged.

    Attributes:
      plane, line: names of the XPlane and XLine it is on.
      name: the event's metadata name (a kernel name, an HLO op name, a TraceMe).
      start_ns, duration_ns: absolute start (ns since the epoch) and length, nanoseconds
        (converted from the file's picoseconds).
      stats: stat name -> value (int, float, str or bytes; ``ref_value`` resolved to the
        referenced stat metadata's name, as XProf's XStatVisitor does).
    """

    plane: str
    line: str
    name: str
    start_ns: float
    duration_ns: float
    stats: dict

    @property
    def end_ns(self) -> float:
        return self.start_ns + self.duration_ns


@dataclass
class XSpaceData:
    """What an XSpace holds that jaxmove uses.

    Attributes:
      events: every event of every line (derived lines included; the reader filters).
      programs: program id -> (HloModule name, serialized HloProto bytes) from ``/host:metadata``.
      plane_stats: plane name -> its plane-level stats (device vendor, core count...).
    """

    events: list[XPlaneEvent] = field(default_factory=list)
    programs: dict[int, tuple[str, bytes]] = field(default_factory=dict)
    plane_stats: dict[str, dict] = field(default_factory=dict)


@functools.cache
def _messages():
    """The XSpace message class, built from a FileDescriptorProto matching tsl's xplane.proto."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="jaxmove_xplane.proto", package="jaxmove.xplane",
                                             syntax="proto3")
    pkg = ".jaxmove.xplane."

    def msg(name, fields, oneofs=(), nested=()):
        m = fdp.message_type.add(name=name)
        for o in oneofs:
            m.oneof_decl.add(name=o)
        for spec in fields:
            fname, num, ftype, label = spec[:4]
            f = m.field.add(name=fname, number=num, type=ftype, label=label)
            if ftype == F.TYPE_MESSAGE:
                f.type_name = spec[4]
            if len(spec) > 5 and spec[5] is not None:
                f.oneof_index = spec[5]
        for n in nested:
            m.nested_type.append(n)
        return m

    OPT, REP = F.LABEL_OPTIONAL, F.LABEL_REPEATED

    def map_entry(name, value_type):
        e = descriptor_pb2.DescriptorProto(name=name)
        e.field.add(name="key", number=1, type=F.TYPE_INT64, label=OPT)
        e.field.add(name="value", number=2, type=F.TYPE_MESSAGE, label=OPT, type_name=value_type)
        e.options.map_entry = True
        return e

    msg("XSpace", [("planes", 1, F.TYPE_MESSAGE, REP, pkg + "XPlane"),
                   ("errors", 2, F.TYPE_STRING, REP), ("warnings", 3, F.TYPE_STRING, REP),
                   ("hostnames", 4, F.TYPE_STRING, REP)])
    msg("XPlane", [("id", 1, F.TYPE_INT64, OPT), ("name", 2, F.TYPE_STRING, OPT),
                   ("lines", 3, F.TYPE_MESSAGE, REP, pkg + "XLine"),
                   ("event_metadata", 4, F.TYPE_MESSAGE, REP, pkg + "XPlane.EventMetadataEntry"),
                   ("stat_metadata", 5, F.TYPE_MESSAGE, REP, pkg + "XPlane.StatMetadataEntry"),
                   ("stats", 6, F.TYPE_MESSAGE, REP, pkg + "XStat")],
        nested=[map_entry("EventMetadataEntry", pkg + "XEventMetadata"),
                map_entry("StatMetadataEntry", pkg + "XStatMetadata")])
    msg("XLine", [("id", 1, F.TYPE_INT64, OPT), ("display_id", 10, F.TYPE_INT64, OPT),
                  ("name", 2, F.TYPE_STRING, OPT), ("display_name", 11, F.TYPE_STRING, OPT),
                  ("timestamp_ns", 3, F.TYPE_INT64, OPT), ("duration_ps", 9, F.TYPE_INT64, OPT),
                  ("events", 4, F.TYPE_MESSAGE, REP, pkg + "XEvent")])
    msg("XEvent", [("metadata_id", 1, F.TYPE_INT64, OPT, None, None),
                   ("offset_ps", 2, F.TYPE_INT64, OPT, None, 0),
                   ("num_occurrences", 5, F.TYPE_INT64, OPT, None, 0),
                   ("duration_ps", 3, F.TYPE_INT64, OPT, None, None),
                   ("stats", 4, F.TYPE_MESSAGE, REP, pkg + "XStat", None)], oneofs=("data",))
    msg("XStat", [("metadata_id", 1, F.TYPE_INT64, OPT, None, None),
                  ("double_value", 2, F.TYPE_DOUBLE, OPT, None, 0),
                  ("uint64_value", 3, F.TYPE_UINT64, OPT, None, 0),
                  ("int64_value", 4, F.TYPE_INT64, OPT, None, 0),
                  ("str_value", 5, F.TYPE_STRING, OPT, None, 0),
                  ("bytes_value", 6, F.TYPE_BYTES, OPT, None, 0),
                  ("ref_value", 7, F.TYPE_UINT64, OPT, None, 0)], oneofs=("value",))
    msg("XEventMetadata", [("id", 1, F.TYPE_INT64, OPT), ("name", 2, F.TYPE_STRING, OPT),
                           ("display_name", 4, F.TYPE_STRING, OPT), ("metadata", 3, F.TYPE_BYTES, OPT),
                           ("stats", 5, F.TYPE_MESSAGE, REP, pkg + "XStat"),
                           ("child_id", 6, F.TYPE_INT64, REP)])
    msg("XStatMetadata", [("id", 1, F.TYPE_INT64, OPT), ("name", 2, F.TYPE_STRING, OPT),
                          ("description", 3, F.TYPE_STRING, OPT)])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("jaxmove.xplane.XSpace"))


def parse_xspace(data: bytes, path: str = "<bytes>") -> XSpaceData:
    """Decode a serialized XSpace.

    Raises:
      CaptureFormatError: the bytes are no XSpace (truncated or another format), or hold no plane.
    """
    from google.protobuf.message import DecodeError

    XSpace = _messages()
    space = XSpace()
    try:
        space.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as e:
        raise CaptureFormatError(f"{path}: not a readable XProf XSpace protobuf (truncated or another "
                                 f"format: {e})") from None
    if not space.planes:
        raise CaptureFormatError(f"{path}: the XSpace holds no plane (not an XProf profile, or empty)")
    out = XSpaceData()
    for plane in space.planes:
        stat_md = dict(plane.stat_metadata)
        ev_md = dict(plane.event_metadata)

        names = {k: v.name for k, v in stat_md.items()}

        def stats_of(stats, names=names):  # runs once per event: kept flat
            d = {}
            for st in stats:
                name = names.get(st.metadata_id)
                if name is None:
                    continue
                kind = st.WhichOneof("value")
                if kind is None:
                    d[name] = None
                elif kind == "ref_value":
                    d[name] = names.get(st.ref_value)
                else:
                    d[name] = getattr(st, kind)
            return d

        out.plane_stats[plane.name] = stats_of(plane.stats)
        if plane.name == "/host:metadata":
            for mid, md in ev_md.items():
                s = stats_of(md.stats)
                proto = s.get("Hlo Proto", s.get("hlo_proto"))
                if isinstance(proto, bytes):
                    # "jit_dot(64)": the module name, then "(program id)"; the metadata id is
                    # the program id in XLA:GPU captures but a counter in XLA:CPU ones
                    m = re.fullmatch(r"(.*)\((\d+)\)", md.name)
                    name, pid = (m.group(1), int(m.group(2))) if m else (md.name, int(mid))
                    out.programs[pid] = (name, proto)
            continue
        md_stats = {mid: stats_of(md.stats) for mid, md in ev_md.items() if md.stats}
        for line in plane.lines:
            base_ps = line.timestamp_ns * 1000
            for ev in line.events:
                md = ev_md.get(ev.metadata_id)
                stats = dict(md_stats.get(ev.metadata_id, ()))
                stats.update(stats_of(ev.stats))
                out.events.append(XPlaneEvent(
                    plane.name, line.name, md.name if md is not None else "",
                    (base_ps + ev.offset_ps) / 1000.0, ev.duration_ps / 1000.0, stats))
    return out


def read_xspace_file(path: str | os.PathLike) -> XSpaceData:
    """``parse_xspace`` of a file.

    Raises:
      FileNotFoundError; CaptureFormatError (see ``parse_xspace``).
    """
    p = os.fspath(path)
    with open(p, "rb") as f:
        data = f.read()
    return parse_xspace(data, p)
