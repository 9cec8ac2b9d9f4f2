"""How the CLI prints: human sizes and times, aligned tables, the registry's JSON (`--json`) on
stdout; notes and progress bars on stderr, so that stdout can be piped.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from tensor_registry.units import format_size

__all__ = ["format_size"]


_FACTORS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_size(text: str) -> int:
    """'10GB', '500M', '1.5 GiB', '0' -> bytes (decimal units unless 'i' says binary)."""
    raw = text.strip().lower().replace(" ", "")
    number = raw.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = raw[len(number) :].removesuffix("b")
    factor = _BINARY.get(unit) or _FACTORS.get(unit)
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if factor is None or value < 0:
        raise ValueError(f"{text!r} is not a size such as 10GB, 500MB or 1.5GiB")
    return int(value * factor)


def variant_label(dtype: Any, fmt: Any, tp: Any, encrypted: Any) -> str:
    """One spelling of a variant for tables: 'bfloat16/hf/tp1', '.../encrypted'."""
    return f"{dtype}/{fmt}/tp{tp}" + ("/encrypted" if encrypted else "")


def job_makes(job: dict[str, Any]) -> str:
    """What a job makes: the version and variant of a tensorize (or verify) job's artifact,
    from the job's typed ``variant`` (none for an import, or once the artifact is gone)."""
    variant = job.get("variant")
    if not variant:
        return "-"
    label = variant_label(
        variant["dtype"],
        variant["format"],
        variant["tensor_parallel_size"],
        variant["encrypted"],
    )
    return f"v{variant['version']} {label}"


def job_storage(job: dict[str, Any]) -> str | None:
    """Where a job's artifact is stored (its typed ``variant``'s storage)."""
    return (job.get("variant") or {}).get("storage")


def format_time(value: str | None) -> str:
    """'2026-12-01T18:20:01.123+00:00' -> '2026-12-01 18:20:01'."""
    if not value:
        return "-"
    return str(value).replace("T", " ")[:19]


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def say(message: str) -> None:
    """A note for the person at the terminal, on stderr."""
    print(message, file=sys.stderr, flush=True)


def progress_bar(total: int | None, desc: str) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        file=sys.stderr,
        disable=None,  # only on a terminal
        leave=False,
    )


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Columns padded to their widest cell; an empty table prints the headers only."""
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        line = "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        sys.stdout.write(line.rstrip() + "\n")


def print_fields(pairs: Sequence[tuple[str, Any]]) -> None:
    width = max(len(k) for k, _ in pairs) + 1
    for key, value in pairs:
        shown = "-" if value is None or value == [] else value
        if isinstance(shown, list):
            shown = ", ".join(map(str, shown))
        print(f"{key + ':':<{width}} {shown}")
