"""The pages' parameter forms: each refusal is an error of the field the user typed it in, so
the page can say which box to fix, and a refused range still leaves the page something to draw."""

from datetime import UTC, datetime, timedelta

from django.http import QueryDict

from dashboard.forms import DecisionForm, RangeForm

NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


def test_a_preset_is_read_and_nothing_asked_means_the_pages_default():
    assert RangeForm(QueryDict("range=6h"), now=NOW).time_range.span == timedelta(hours=6)
    assert RangeForm(QueryDict(""), now=NOW, default="7d").time_range.span == timedelta(days=7)


def test_a_bad_moment_is_an_error_of_its_own_field_and_the_default_is_shown():
    form = RangeForm(QueryDict("start=yesterday&end=2026-03-09T00:00"), now=NOW, default="24h")
    assert not form.is_valid()
    assert list(form.errors) == ["start"]
    assert form.error.startswith("start ")
    assert (form.time_range.key, form.time_range.end) == ("24h", NOW)


def test_an_unknown_preset_is_an_error_of_range_and_a_reversed_pair_of_the_whole_form():
    assert list(RangeForm(QueryDict("range=1y"), now=NOW).errors) == ["range"]
    reversed_pair = RangeForm(QueryDict("start=2026-03-03T00:00&end=2026-03-01T00:00"), now=NOW)
    assert list(reversed_pair.errors) == ["__all__"]
    assert reversed_pair.error == "The end of the range must be after its start."


def test_a_heatmap_click_opens_the_window_around_that_moment():
    form = RangeForm(QueryDict("at=2026-03-09T12:00"), now=NOW)
    assert form.time_range.at == datetime(2026, 3, 9, 12, 0, tzinfo=UTC)
    assert form.time_range.span == timedelta(hours=12)


def test_a_decision_comment_keeps_its_spaces_and_refuses_a_nul_character():
    kept = DecisionForm({"comment": "  ok, on Friday "})
    assert kept.is_valid()
    assert kept.cleaned_data["comment"] == "  ok, on Friday "
    refused = DecisionForm({"comment": "no\x00"})
    assert not refused.is_valid()
    assert list(refused.errors) == ["comment"]
