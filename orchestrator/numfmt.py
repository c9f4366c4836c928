"""Numbers as every report line prints them: rounded first, so a value that rounds to zero prints without a sign
("0.000", never "-0.000"); `signed` puts "+" on positive values only after that rounding."""

from __future__ import annotations

import math


def _rounded(value: float, digits: int) -> float:
    shown = round(value, digits)
    return 0.0 if shown == 0 else shown  # -0.0 == 0: the sign of a negative zero is dropped here


def fixed(value: float, digits: int = 2) -> str:
    if not math.isfinite(value):
        return str(value)
    return f"{_rounded(value, digits):.{digits}f}"


def signed(value: float, digits: int = 2) -> str:
    """Sign and digits: +1.20, -0.40, and 0.00 for anything that rounds to zero (no sign: it is neither)."""
    if not math.isfinite(value):
        return f"{value:+}"
    shown = _rounded(value, digits)
    return f"{shown:.{digits}f}" if shown == 0 else f"{shown:+.{digits}f}"
