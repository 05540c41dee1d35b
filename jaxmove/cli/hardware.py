"""``jaxmove hardware`` and ``jaxmove calibrate``: the hardware subcommands of the CLI.

Thin, like ``cli.py``: they call ``jaxmove.hardware`` and render with rich.
"""

from __future__ import annotations

import argparse
import sys


def _si(value: float | None, unit: str) -> str:
    """3.35e12, 'B/s' -> '3.35 TB/s' (decimal prefixes, as datasheets print them)."""
    if value is None:
        return "-"
    for scale, p in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.4g} {p}{unit}"
    if unit == "s" and value < 1e-3:
        return f"{value * 1e6:.3g} us"
    return f"{value:.4g} {unit}"


def _binary(n: int | None) -> str:
    if n is None:
        return "-"
    for scale, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n} B"


def _onchip(spec) -> str:
    parts = []
    if spec.l2_bytes:
        parts.append(f"L2 {_binary(spec.l2_bytes)}" if spec.kind != "cpu" else f"LLC {_binary(spec.l2_bytes)}")
    if spec.smem_per_sm_bytes:
        parts.append(f"smem {_binary(spec.smem_per_sm_bytes)}/SM" + (f" x{spec.num_sms}" if spec.num_sms else ""))
    if spec.vmem_bytes:
        parts.append(f"VMEM {_binary(spec.vmem_bytes)}")
    return ", ".join(parts) or "-"


def _link(spec) -> str:
    if spec.intra_node_bytes_per_s:
        return _si(spec.intra_node_bytes_per_s, "B/s")
    return "-"


def _spec_json(spec) -> dict:
    """One spec for ``jaxmove hardware --json``: name, kind, vendor, label, path, every number
    (``numeric_fields``: dotted keys, SI units as the key names say: ``_bytes``, ``_s``,
    ``_per_s``, ``flops_per_s.<dtype>`` in FLOP/s), its source per key, the published values it
    does not use, notes, and the ``--target`` syntax ('' when it is no compile target)."""
    from ..capture.targets import target_syntax
    return {"name": spec.name, "kind": spec.kind, "vendor": spec.vendor, "label": spec.label,
            "path": spec.path or None, "values": dict(spec.numeric_fields()),
            "sources": {k: spec.sources.get(k, "") for k in spec.numeric_fields()},
            "alternatives": [{"key": a.key, "value": a.value, "source": a.source, "note": a.note}
                             for a in spec.alternatives],
            "notes": spec.notes or "", "target": target_syntax(spec) or ""}


def cmd_hardware(args: argparse.Namespace) -> int:
    from rich.markup import escape
    from rich.table import Table

    from ..hardware import list_specs, load_spec
    from ..report.table import make_console

    overrides = getattr(args, "spec", None) or []
    if overrides and not args.name:
        from ..errors import UsageError
        raise UsageError("--spec overrides one spec's numbers: name it (jaxmove hardware NAME --spec KEY=VALUE)")

    def named(name):
        spec = load_spec(name)
        if overrides:   # (the numbers analyze --spec would cost with, and their sources)
            from ..hardware.overrides import override_spec
            spec = override_spec(spec, overrides)
        return spec

    if getattr(args, "json", False):
        import json
        specs = [named(args.name)] if args.name else list_specs(include_local=True)
        out = [_spec_json(sp) for sp in specs]
        print(json.dumps(out[0] if args.name else {"specs": out}, indent=1))
        return 0
    console = make_console()
    if args.name:
        spec = named(args.name)
        console.print(f"[bold]{escape(spec.name)}[/bold]: {escape(spec.label)} ({spec.kind}, {escape(spec.vendor)})"
                      + (f"  file={escape(spec.path)}" if spec.path else ""))
        table = Table(title="Every number and its source")
        table.add_column("key", style="bold")
        table.add_column("value", justify="right")
        table.add_column("source")
        for key, value in spec.numeric_fields().items():
            unit = ("FLOP/s" if key.startswith("flops_per_s.") else "B/s" if key.endswith("bytes_per_s")
                    else "s" if key.endswith("_s") else "")
            shown = (_binary(int(value)) if key.endswith("_bytes") else _si(value, unit) if unit
                     else str(value))
            table.add_row(key, shown, escape(spec.sources.get(key, "")))
        console.print(table)
        if spec.alternatives:
            alt = Table(title="Published values not used (and why)")
            for col in ("key", "value", "source", "note"):
                alt.add_column(col)
            for a in spec.alternatives:
                alt.add_row(a.key, f"{a.value:g}", escape(a.source), escape(a.note))
            console.print(alt)
        if spec.notes:
            console.print(f"[yellow]notes:[/yellow] {escape(spec.notes)}")
        return 0

    specs = list_specs(include_local=True)
    table = Table(title="Hardware specs (jaxmove analyze TARGET --hardware NAME; "
                        "jaxmove hardware NAME: every number and its source; the --target column: "
                        "the specs jaxmove can compile for without the device)")
    for col, kw in (("name", {"style": "bold", "no_wrap": True}), ("device", {}),
                    ("bf16 peak", {"justify": "right"}), ("f32 peak", {"justify": "right"}),
                    ("HBM bw", {"justify": "right"}), ("HBM size", {"justify": "right"}),
                    ("on-chip", {}), ("launch", {"justify": "right"}),
                    ("link/dir", {"justify": "right"}), ("--target", {"no_wrap": True})):
        table.add_column(col, **kw)
    from ..capture.targets import target_syntax
    for s in specs:
        table.add_row(s.name, escape(s.label), _si(s.flops_per_s.get("bf16"), "FLOP/s"),
                      _si(s.flops_per_s.get("f32"), "FLOP/s"), _si(s.hbm_bytes_per_s, "B/s"),
                      _si(s.hbm_capacity_bytes, "B"), _onchip(s), _si(s.kernel_launch_overhead_s, "s"),
                      _link(s), escape(target_syntax(s)) or "-")
    console.print(table)
    console.print("[bold]Sources of the key figures[/bold] (bf16 peak; HBM bandwidth):")
    for s in specs:
        console.print(f"  [bold]{s.name}[/bold]: bf16: {escape(s.sources.get('flops_per_s.bf16', '-'))}; "
                      f"HBM: {escape(s.sources.get('hbm_bytes_per_s', '-'))}", soft_wrap=True)
    from ..hardware import local_spec_path

    if not local_spec_path().is_file():
        console.print(f"no 'local' spec yet: `jaxmove calibrate` measures this machine "
                      f"(writes {escape(str(local_spec_path()))})")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from ..hardware import CalibrationError, calibrate, local_spec_path, write_spec

    from ..report.outputs import OutputPathError, check_output_path

    # before measuring: a bad path must not cost the calibration; only the default cache
    # location may be created
    target = check_output_path(args.output or local_spec_path(), "calibrated spec",
                               create_parent=args.output is None)
    shown = args.output or str(target)

    def progress(msg: str) -> None:
        print(f"jaxmove calibrate: {msg}", file=sys.stderr, flush=True)

    try:
        spec = calibrate(quick=args.quick, progress=progress)
    except CalibrationError as e:
        print(f"jaxmove: error: calibration failed: {e}", file=sys.stderr)
        return 1
    from ..hardware.calibrate import spread_limit, unstable_figures

    unstable = unstable_figures(spec)
    print(f"{spec.label}")
    print_calibrated_figures(spec, unstable)
    for key in unstable:
        cal = spec.calibration or {}
        sp = cal.get(f"{key.replace('.', '_')}_spread")
        reps = cal.get(f"{key.replace('.', '_')}_repeats", cal.get("repeats"))  # (older files: one count)
        how = (f"spread {sp:.0%} over {reps} repeats exceeds "
               f"{spread_limit(key):.0%}" if isinstance(sp, float) and sp >= 0 else "no stable estimate")
        print(f"jaxmove: warning: {key}: {how}; the machine is probably busy", file=sys.stderr)
    if unstable and not args.force:
        print(f"jaxmove: error: not saved: {len(unstable)} figure(s) unstable ({', '.join(unstable)}); "
              "calibrate on an idle machine (or without --quick: more repeats), pass --force to save "
              "them anyway (the file marks them unstable), or use a shipped spec (--hardware "
              "cpu-generic; see `jaxmove hardware`)", file=sys.stderr)
        return 1
    try:
        path = write_spec(spec, target)
    except OSError as e:
        raise OutputPathError(f"{shown}: cannot write calibrated spec ({e.strerror or e})") from None
    print(f"wrote {path}" + ("  (use: --hardware local)" if args.output is None else
                              f"  (use: --hardware {path})")
          + (f"  [--force: {len(unstable)} unstable figure(s) saved]" if unstable else ""))
    return 0


def print_calibrated_figures(spec, unstable: list[str] = ()) -> None:
    """Every figure a calibrated spec holds, with its spread over the repeats: what
    ``calibrate`` saves (``spec.numeric_fields()``)."""
    cal = spec.calibration or {}
    for key, value in spec.numeric_fields().items():
        unit = ("FLOP/s" if key.startswith("flops_per_s.") else "B/s" if key.endswith("bytes_per_s")
                else "s" if key.endswith("_s") else "")
        shown = (_binary(int(value)) if key.endswith("_bytes") else _si(value, unit) if unit else str(value))
        sp = cal.get(f"{key.replace('.', '_')}_spread")
        spread_txt = (f"  spread {sp:.0%}" if isinstance(sp, float) and sp >= 0 else
                      "  spread: no stable estimate" if isinstance(sp, float) else "")
        flag = "  UNSTABLE" if key in unstable else ""
        print(f"  {key:<28} {shown:>12}{spread_txt}{flag}")


def add_hardware_commands(sub) -> None:
    """Register ``hardware`` and ``calibrate`` on the CLI's subparsers."""
    h = sub.add_parser("hardware", help="list the hardware specs (peak FLOP/s, HBM, on-chip sizes, sources)",
                       description="Without NAME: a table of every built-in spec (and the calibrated "
                                   "'local' one) with its key figures. With NAME (a built-in name, "
                                   "'local' or a .toml path): every number with its source, and the "
                                   "published values it does not use.")
    h.add_argument("name", nargs="?", help="a spec to show in full")
    h.add_argument("--spec", action="append", default=[], metavar="KEY=VALUE",
                   help="with NAME: show it with these numbers overridden, as analyze --spec costs with "
                        "them (repeatable)")
    h.add_argument("--json", action="store_true",
                   help="JSON on stdout: {\"specs\": [...]} without NAME, the one spec with it (name, kind, "
                        "values by dotted key in SI units, sources, alternatives, notes, target)")
    h.set_defaults(func=cmd_hardware)

    c = sub.add_parser("calibrate", help="measure this machine's device and write the 'local' spec",
                       description="Measure the local default JAX device with jax itself: memory "
                                   "bandwidth from a large streaming update, peak FLOP/s per dtype from "
                                   "large matmuls, per-kernel overhead from chains of tiny kernels; "
                                   "each probe repeated, the median kept, and the spec saved only when "
                                   "the repeats agree (or with --force). "
                                   "Writes a spec that `--hardware local` then uses (atomically: a "
                                   "temporary file renamed over the target).")
    c.add_argument("--quick", action="store_true",
                   help="smaller problems and fewer repetitions (seconds; for CI)")
    c.add_argument("--force", action="store_true",
                   help="save the spec even when a figure's spread over the repeats exceeds its limit "
                        "(25%% for bandwidths and peaks, 50%% for overheads; a busy machine)")
    c.add_argument("-o", "--output", metavar="PATH",
                   help="write the spec here instead of $JAXMOVE_CACHE_DIR/local.toml "
                        "(default ~/.cache/jaxmove/local.toml)")
    c.set_defaults(func=cmd_calibrate)
