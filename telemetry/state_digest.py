"""A health state row's reading as one 64-bit number, its digest.

The collector asks PostgreSQL which stored state rows differ from a batch's readings (most
batches: none). Sending every field of 2,000 rows as JSON to be parsed and compared column by
column cost ~15 ms a batch of 50 hosts, client and server together; sending each row's key and
digest, compared with the digest stored beside the row, costs a fraction of that
(docs/benchmarks.md, issue 21 item 1). The digest is written with the row (`telemetry.ingest`,
and `StateRow.save` for every other writer), so a row always carries the digest of what it holds.

Equal readings give equal digests, as PostgreSQL's comparison of the columns would find them:
fields are taken in name order, a float column's value as a float (an agent's `87` is the
stored `87.0`; -0.0 is 0.0), a time as Unix seconds, JSON with sorted keys. A reading that
differs in any field gives another digest but for a chance of 1 in 2^64 per changed row
(BLAKE2b cut to 8 bytes).

Pure: the field kinds come from the caller (`for_model` reads them from a model's metadata).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence
from datetime import datetime

import orjson

#: Columns of a state row that are not its reading.
NOT_READING = frozenset({"changed_at", "reading_digest"})
_FLOAT_KINDS = frozenset({"FloatField", "DateTimeField"})


class Digest:
    """The digest of readings given as values in the order of `names` (model attribute names);
    `floats` names the fields compared as numbers with a fraction (floats and times)."""

    def __init__(self, names: Sequence[str], floats: Collection[str]):
        self.names = tuple(names)
        self._order = sorted(range(len(self.names)), key=self.names.__getitem__)
        self._floats = frozenset(i for i, name in enumerate(self.names) if name in floats)

    def __call__(self, values: Sequence) -> int:
        canonical = [values[i] for i in self._order]
        for position, i in enumerate(self._order):
            value = canonical[position]
            if value is None or i not in self._floats:
                continue
            canonical[position] = (value.timestamp() if isinstance(value, datetime) else float(value)) + 0.0
        raw = orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS)
        return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "big", signed=True)

    def of_row(self, row) -> int:
        """The digest of a model instance's reading."""
        return self(tuple(getattr(row, name) for name in self.names))


def reading_names(model, keys: Collection[str]) -> tuple[str, ...]:
    """A state model's reading fields (attribute names): every concrete column but its primary
    key, the `keys` that name a row, `changed_at` and the digest itself."""
    return tuple(f.attname for f in model._meta.concrete_fields
                 if not f.primary_key and f.attname not in keys and f.attname not in NOT_READING)


def for_model(model, keys: Collection[str], names: Sequence[str] | None = None) -> Digest:
    """The digest of `model`'s readings given in the order of `names` (default: `reading_names`)."""
    names = tuple(names) if names is not None else reading_names(model, keys)
    floats = {f.attname for f in model._meta.concrete_fields if f.get_internal_type() in _FLOAT_KINDS}
    return Digest(names, floats)
