"""Time text for people (jaxmove/units.short_seconds): 3 significant digits, the unit chosen after
rounding (a sweep showed a compile of 0.99982 s as '1e+03 ms')."""

from __future__ import annotations

import pytest

from jaxmove.units import short_seconds


@pytest.mark.parametrize("t,text", [
    (0.99982, "1 s"), (0.99996e-3, "1 ms"), (0.0123, "12.3 ms"), (1.5, "1.5 s"), (42e-6, "42 us"),
    (999.6, "1,000 s"), (3600.4, "3,600 s"), (0.0, "0 us"), (-0.5, "-500 ms"), (None, "n/a")])
def test_short_seconds(t, text):
    assert short_seconds(t) == text
