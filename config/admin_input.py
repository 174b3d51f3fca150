"""Bad input the admin site does not guard against itself, answered as the admin answers any
other invalid value instead of with a 500.

- Date hierarchy (the year / month / day links above a changelist): Django reads
  `?<field>__year=`, `__month=` and `__day=` with `int()` and catches only ValueError, but
  `year=253402300800` overflows building the datetime, and `year=9999` overflows computing the
  end of that year. Each is checked first, as `config.parsing` reads numbers; a bad one is the
  admin's "invalid filter" answer (a redirect to `?e=1`).
- Filters and search: a value with a NUL character reaches the query as it is, and PostgreSQL
  refuses it; it is an invalid filter too.
- Autocomplete fields: a refused form is shown again with what was typed, and Django's widget
  looks the typed value up as it is, so `abc` in a user or host field raised ValueError. Values
  that are not an id of the related model are left out of that lookup (the field's own error
  already says it).

- Formsets: Django builds and validates as many forms as the management form's TOTAL_FORMS
  asks, up to 1,000 or more, and a forged `10**30` cost seconds a request. An inline takes at
  most INLINE_MAX_FORMS, a changelist's editable rows at most the rows a page shows; more is
  the formset's own "Please submit at most ... forms".

`SafeInputAdminMixin` brings these to a ModelAdmin; `guard_registered` to the admins other apps
registered.
"""

from __future__ import annotations

from datetime import MAXYEAR

from django.contrib.admin import widgets
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import ValidationError

from config import parsing

#: Forms an inline formset takes in one submission (the fleet's inlines list a host's GPUs, a
#: GPU's vGPUs: a few dozen at most).
INLINE_MAX_FORMS = 200
#: What each part may be; the year stops one short of datetime's last, whose end overflows.
DATE_PARTS = {"year": (1, MAXYEAR - 1), "month": (1, 12), "day": (1, 31)}


class SafeChangeList(ChangeList):
    def get_filters(self, request):
        if any("\x00" in value for values in request.GET.lists() for value in values[1]):
            raise IncorrectLookupParameters("NUL characters are not allowed.")
        for part, (low, high) in DATE_PARTS.items():
            for raw in request.GET.getlist(f"{self.date_hierarchy}__{part}") if self.date_hierarchy else ():
                try:
                    parsing.parse_int(raw, minimum=low, maximum=high)
                except parsing.ParseError as exc:
                    raise IncorrectLookupParameters(f"{part}: {exc}") from None
        return super().get_filters(request)


class AutocompleteSelect(widgets.AutocompleteSelect):
    def optgroups(self, name, value, attr=None):
        target = self.field.target_field
        ids = []
        for item in value:
            try:
                target.to_python(item)
            except ValidationError:
                continue
            ids.append(item)
        return super().optgroups(name, ids, attr)


class SafeInputAdminMixin:
    def get_changelist(self, request, **kwargs):
        return SafeChangeList

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if "widget" not in kwargs and db_field.name in self.get_autocomplete_fields(request):
            kwargs["widget"] = AutocompleteSelect(db_field, self.admin_site, using=kwargs.get("using"))
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_formsets_with_inlines(self, request, obj=None):
        for formset, inline in super().get_formsets_with_inlines(request, obj):
            formset.absolute_max = min(formset.absolute_max, max(INLINE_MAX_FORMS, formset.max_num))
            yield formset, inline

    def get_changelist_formset(self, request, **kwargs):
        rows = max(self.list_per_page, self.list_max_show_all)
        kwargs.setdefault("max_num", rows)
        kwargs.setdefault("absolute_max", rows)
        return super().get_changelist_formset(request, **kwargs)


def guard_registered(site, models) -> None:
    """Register the admins of `models` (another app registered them) again, with SafeInputAdminMixin."""
    for model in models:
        if site.is_registered(model):
            model_admin = type(site.get_model_admin(model))
            site.unregister(model)
            site.register(model, type(model_admin.__name__, (SafeInputAdminMixin, model_admin),
                                      {"__module__": model_admin.__module__}))
