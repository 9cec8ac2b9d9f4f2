"""Sizes as people read them: the one formatter the CLI, the agent and the web UI agree on."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

_UNITS = ("B", "kB", "MB", "GB", "TB", "PB")
_TENTH = Decimal("0.1")


def format_size(n: int | float | None) -> str:
    """Decimal units, as `du --si`, `hf` and vLLM's logs print them: 183528849 -> '183.5 MB'.

    The web UI prints sizes the same way (tensor_registry_server/ui/js/dom.js formatBytes): the
    same units and
    the same rounding (half up on the exact value, as JavaScript's toFixed), so a size reads
    the same in both (tests/ui/test_sizes.py compares them)."""
    if n is None:
        return "-"
    value = float(n)
    for unit in _UNITS:
        if abs(value) < 1000 or unit == _UNITS[-1]:
            if unit == "B":
                return f"{int(value)} B"
            return f"{Decimal(value).quantize(_TENTH, rounding=ROUND_HALF_UP)} {unit}"
        value /= 1000
    raise AssertionError("unreachable")
