"""The compact form of a heatmap matrix (`/api/v1/heatmap/?encoding=typed`) and the grouping of
rows the page asks for when a fleet has more rows than a screen. Pure: no ORM, no HTTP.

**Typed matrix.** A heatmap colours each cell on one scale from `zmin` to `zmax`; a colour scale
shows a few hundred distinct colours at most, so the cells are sent as one byte each: code
`round((value - offset) / step)` with `offset = zmin` and `step = (zmax - zmin) / 254`, code 255
meaning "no data". The matrix travels as Plotly's typed-array object (`dtype`, `bdata` = the
bytes in base64, `shape` = "rows, columns", row-major) plus `offset`, `step` and `null`, so a
script decodes it with the standard library (`decode` below). A decoded value is within half a
step of the exact one (`precision`); 0.2 percentage points for a % metric.

**Fixed scales.** A % metric is drawn from 0 to 100 whatever the cells, so its codes do not
depend on the request: `fixed_codes` writes them as PostgreSQL does for the typed heatmap, and
`telemetry.strips` keeps them per GPU and day.

**Groups.** Rows past a screen are drawn as consecutive groups of the sorted rows, each cell
the highest of its members' cells (a hot GPU never disappears into a group's mean), so the
page stays responsive at 10,000 GPUs: one group a host where rows are sorted by host and the
hosts fit, else groups of equal size. A group names its rows' window (`row_start`,
`row_count`) for the drill-down.
"""

from __future__ import annotations

import base64
import math
import zlib
from collections.abc import Sequence

#: Codes 0..LEVELS; NULL_CODE marks a cell without data.
LEVELS = 254
NULL_CODE = 255
DTYPE = "u1"


def quantisation(zmin: float | None, zmax: float | None) -> tuple[float, float]:
    """`(offset, step)` of the codes for a scale from `zmin` to `zmax` (step 1 where the scale
    is a single value or there is no data: every code is then 0)."""
    if zmin is None or zmax is None:
        return 0.0, 1.0
    if zmax <= zmin:
        return float(zmin), 1.0
    return float(zmin), (zmax - zmin) / LEVELS


def fixed_codes(values: Sequence[float | None], zmin: float, zmax: float) -> bytes:
    """Codes of `values` on the fixed scale `zmin`-`zmax` (a % metric's 0-100), with the very
    arithmetic of the typed heatmap's SQL (`telemetry.heatmap._codes_sql`): the same value gets
    the same code whichever of the two wrote it."""
    per = LEVELS / (zmax - zmin)
    return bytes([NULL_CODE if v is None else min(LEVELS, max(0, math.floor((v - zmin) * per + 0.5)))
                  for v in values])


def encode_row(cells: Sequence[float | None], offset: float, step: float) -> bytes:
    """One row's codes."""
    scale = 1.0 / step
    # int(x + 0.5) rounds half up for x >= 0; the clamps absorb float noise at the scale's ends.
    return bytes([NULL_CODE if v is None else min(LEVELS, max(0, int((v - offset) * scale + 0.5))) for v in cells])


def typed_matrix(rows: Sequence[bytes], columns: int, zmin: float | None, zmax: float | None) -> dict:
    """The `z` of a typed answer from each row's codes (`encode_row`, on the scale `zmin`-`zmax`):
    Plotly's typed-array keys plus what decodes the codes."""
    offset, step = quantisation(zmin, zmax)
    data = b"".join(rows)
    return {
        "dtype": DTYPE, "bdata": base64.b64encode(data).decode("ascii"), "shape": f"{len(rows)}, {columns}",
        "offset": offset, "step": step, "null": NULL_CODE, "precision": step / 2,
    }


def decode(z: dict) -> list[list[float | None]]:
    """The rows of a typed `z` as values (None where there is no data): what a script does with
    `?encoding=typed`, and what the page's script does before handing Plotly the rows."""
    if z.get("dtype") != DTYPE:
        raise ValueError(f"unknown dtype {z.get('dtype')!r}")
    rows, columns = (int(part) for part in z["shape"].split(","))
    data = base64.b64decode(z["bdata"])
    if len(data) != rows * columns:
        raise ValueError(f"{len(data)} bytes for a {rows} x {columns} matrix")
    offset, step, null = z["offset"], z["step"], z["null"]
    values = [None if code == null else offset + code * step for code in range(256)]
    return [[values[code] for code in data[i * columns:(i + 1) * columns]] for i in range(rows)]


# Groups --------------------------------------------------------------------------------------


def group_windows(rows: int, rows_max: int) -> list[tuple[int, int]]:
    """`(row_start, row_count)` of at most `rows_max` consecutive groups of equal size (the last
    may be smaller) covering `rows` rows; one row a group when they fit."""
    size = max(1, math.ceil(rows / max(1, rows_max)))
    return [(start, min(size, rows - start)) for start in range(0, rows, size)]


def host_runs(host_ids: Sequence[int | None]) -> list[tuple[int, int]]:
    """`(row_start, row_count)` of each run of consecutive rows on the same host (rows sorted by
    host: one run a host)."""
    runs: list[tuple[int, int]] = []
    for i, host in enumerate(host_ids):
        if i and host == host_ids[i - 1]:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


def group_cells(rows: Sequence[Sequence[float | None]]) -> list[float | None]:
    """Column by column, the highest cell of `rows` (None where none has data)."""
    merged: list[float | None] = list(rows[0])
    for row in rows[1:]:
        for j, value in enumerate(row):
            if value is not None and (merged[j] is None or value > merged[j]):
                merged[j] = value
    return merged


#: Codes shifted by one (no data: 0), and back: the highest shifted code is the highest value.
_SHIFT = bytes(range(1, 256)) + bytes([0])
_UNSHIFT = bytes([NULL_CODE]) + bytes(range(255))
#: By length: each byte's bit 7, each byte's low 7 bits, every bit (see `_byte_max`).
_BYTE_MASKS: dict[int, tuple[int, int, int]] = {}


def _byte_max(a: bytes, b: bytes) -> bytes:
    """Byte by byte, the larger of `a` and `b` (same length), computed on whole integers (a few
    big-integer operations instead of one Python step a byte). In each byte, `(x | 0x80) - (y &
    0x7F)` never borrows from the next one and its bit 7 says x >= y on the low 7 bits; the high
    bits decide where they differ."""
    n = len(a)
    masks = _BYTE_MASKS.get(n)
    if masks is None:
        masks = _BYTE_MASKS[n] = tuple(int.from_bytes(bytes([byte]) * n, "big") for byte in (0x80, 0x7F, 0xFF))
    high, low, every = masks
    x, y = int.from_bytes(a, "big"), int.from_bytes(b, "big")
    x_high, y_high = x & high, y & high
    low_ge = ((x | high) - (y & low)) & high
    ge = (x_high & ~y_high) | (low_ge & ~(x_high ^ y_high))  # bit 7 of each byte: x >= y
    keep = (ge >> 7) * 0xFF
    return ((x & keep) | (y & (every ^ keep))).to_bytes(n, "big")


def group_codes(rows: Sequence[bytes]) -> bytes:
    """`group_cells` on codes: column by column, the highest code of `rows` (NULL_CODE where none
    has data). Codes grow with values, so it is the code of the highest value. Rows are merged in
    pairs, all pairs of a round at once (`_byte_max` on the round's joined rows)."""
    width = len(rows[0])
    shifted = [row.translate(_SHIFT) for row in rows]
    while len(shifted) > 1:
        pairs = len(shifted) // 2
        merged = _byte_max(b"".join(shifted[0:2 * pairs:2]), b"".join(shifted[1:2 * pairs:2]))
        shifted = [merged[i * width:(i + 1) * width] for i in range(pairs)] + shifted[2 * pairs:]
    return shifted[0].translate(_UNSHIFT)


#: Codes with "no data" as 0, for sums.
_NULL_AS_ZERO = bytes(range(255)) + bytes([0])
#: Bytes a chunk for Adler-32's first sum: 257 codes of at most LEVELS stay below its modulus.
_SUM_CHUNK = 65521 // LEVELS


def code_sum(codes: bytes) -> int:
    """The sum of the codes of cells with data, in C: Adler-32's first sum is 1 + the sum of the
    bytes modulo 65521, and a chunk of 257 codes cannot reach the modulus."""
    data = codes.translate(_NULL_AS_ZERO)
    total = 0
    for i in range(0, len(data), _SUM_CHUNK):
        total += (zlib.adler32(data[i:i + _SUM_CHUNK]) & 0xFFFF) - 1
    return total


def code_mean(codes: bytes) -> float | None:
    """The mean code of the cells with data (None without any)."""
    count = len(codes) - codes.count(NULL_CODE)
    return code_sum(codes) / count if count else None


def code_peak(codes: bytes) -> int | None:
    """The highest code of a cell with data (None without any)."""
    top = max(codes.translate(_SHIFT), default=0)
    return top - 1 if top else None


def group_label(first: str, last: str, count: int, noun: str) -> str:
    """"first – last (n GPUs)": what a group row says on the page."""
    return first if count == 1 else f"{first} – {last} ({count} {noun})"
