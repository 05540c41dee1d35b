"""Byte counts for people: binary units, as the tables, notes and fix texts print them."""

from __future__ import annotations

_UNITS = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


def human_bytes(n: float) -> str:
    """1536 -> '1.50 KiB' (binary units: KiB = 1024 B); below 1 KiB a whole number of bytes."""
    for scale, unit in _UNITS:
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def short_seconds(t: float | None) -> str:
    """0.0123 -> '12.3 ms' (s, ms or us at 3 significant digits, the unit chosen after the
    rounding: 0.99982 -> '1 s', not '1e+03 ms'; 1000 s and over in whole seconds); None -> 'n/a'."""
    if t is None:
        return "n/a"
    t = float(f"{t:.3g}")
    a = abs(t)
    if a >= 1000:
        return f"{t:,.0f} s"
    if a >= 1:
        return f"{t:.3g} s"
    if a >= 1e-3:
        return f"{t * 1e3:.3g} ms"
    return f"{t * 1e6:.3g} us"
