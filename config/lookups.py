"""`in` of an integer column with a value no such column holds: no match, not a crash.

Django already answers `filter(pk=10**30)` with no rows (its IntegerFieldOverflow lookups), but
`filter(pk__in=[10**30])` reaches the database, where SQLite raises OverflowError: a 500 from a
form that lists ids (the admin's permissions, an autocomplete field shown again after a refused
submission). The values out of the column's range are left out, which is what they would match.
Registered on IntegerField (ids included) by `install()`, from the fleet app's `ready()`.
"""

from __future__ import annotations

from django.db.models import IntegerField
from django.db.models.lookups import In


class IntegerFieldIn(In):
    def process_rhs(self, compiler, connection):
        if self.rhs_is_direct_value():
            low, high = connection.ops.integer_field_range(self.lhs.output_field.get_internal_type())
            self.rhs = [value for value in self.rhs if not isinstance(value, int)
                        or ((low is None or value >= low) and (high is None or value <= high))]
        return super().process_rhs(compiler, connection)


def install() -> None:
    IntegerField.register_lookup(IntegerFieldIn)
