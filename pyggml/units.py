"""Byte sizes in and out: one grammar for every size a user types, one way to print them.

    parse_size("8GiB") == 8 << 30        # also "512 MiB", "2G", "1.5GB", "4096", 4096
    fmt_bytes(3 << 20) == "3.00 MiB"     # MiB below 10 GiB (llama.cpp's unit), GiB above
    size_text(64 << 20) == "64MiB"       # exact, for files a user may edit (YAML)

K/M/G/T are powers of 1024 with or without "i" and "B" ("8G" = "8GB" = "8GiB"): memory sizes
here are always binary, as llama.cpp prints them.
"""

from __future__ import annotations

import re

from pyggml.errors import ConfigError

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40

_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([kmgt]?)(i?b)?\s*", re.IGNORECASE)


def size_or_none(v) -> int | None:
    """Bytes of a size (an int >= 0, or text as in parse_size); None when `v` is not one."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if v >= 0 else None
    m = _SIZE.fullmatch(str(v))
    if not m:
        return None
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2).lower() or " "))


def parse_size(v, what: str = "memory size") -> int:
    """Bytes of '8GiB', '512 MiB', '2G', '1.5GB', '4096' or an int; ConfigError naming `what`
    and the value otherwise (negative sizes included)."""
    n = size_or_none(v)
    if n is None:
        raise ConfigError(f"{what} {v!r}: expected a byte count or a number with a unit "
                          f"(B, KiB, MiB, GiB, TiB; K/M/G/T are powers of 1024), e.g. '8GiB'")
    return n


def fmt_bytes(n: int | None) -> str:
    """'12.34 MiB' (or GiB from 10 GiB on); '-' for None (unknown)."""
    if n is None:
        return "-"
    if abs(n) >= 10 * GiB:
        return f"{n / GiB:.2f} GiB"
    return f"{n / MiB:.2f} MiB"


def size_text(n: int) -> str | int:
    """The shortest exact spelling of a size: '8GiB', '64MiB', or the byte count."""
    for unit, scale in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n and n % scale == 0:
            return f"{n // scale}{unit}"
    return n
