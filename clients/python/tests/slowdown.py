"""How long the tests wait: every deadline a test gives a condition, or a call, is
multiplied by IDEMD_TEST_SLOWDOWN (3 unless set), so that the numbers in the tests are what
an ordinary machine needs and a slow or loaded one still gets its condition in time. A
condition that holds ends its wait at once, so a larger factor only makes a failing test
slower to fail. Lease lengths and timeouts that a test is about are not scaled."""

from __future__ import annotations

import os


def _slowdown() -> float:
    value = os.environ.get("IDEMD_TEST_SLOWDOWN", "")
    if not value:
        return 3.0
    try:
        factor = float(value)
    except ValueError:
        factor = 0.0
    if not factor > 0:
        raise ValueError(f"IDEMD_TEST_SLOWDOWN={value!r}: want a positive number")
    return factor


SLOWDOWN = _slowdown()


def scale(seconds: float) -> float:
    """The deadline for a condition that an ordinary machine meets within seconds."""
    return seconds * SLOWDOWN
