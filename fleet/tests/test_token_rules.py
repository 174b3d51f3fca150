"""The pure rules of API tokens (`fleet.token_rules`): which scope may send what, which scope may
create which, and how an expiry is typed. No database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from config.parsing import ParseError
from fleet.token_rules import check_expiry, covers, parse_expiry, parse_lifetime, scope_refusal, when

NOW = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
BERLIN = ZoneInfo("Europe/Berlin")


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE"])
def test_a_write_token_may_send_anything_anywhere(method):
    assert scope_refusal("write", method, ingest_view=False) is None
    assert scope_refusal("write", method, ingest_view=True) is None


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS", "get"])
def test_a_read_token_may_read(method):
    assert scope_refusal("read", method, ingest_view=False) is None


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE", "patch"])
def test_a_read_token_may_not_write_even_to_an_ingest_view(method):
    for ingest_view in (False, True):
        refusal = scope_refusal("read", method, ingest_view=ingest_view)
        assert refusal == (f"This API token's scope is read: it may read (GET, HEAD, OPTIONS) but not "
                           f"{method.upper()}. Use a token with scope write.")


def test_an_ingest_token_reaches_ingest_views_only():
    assert scope_refusal("ingest", "POST", ingest_view=True) is None
    for method in ("GET", "POST", "DELETE"):
        assert scope_refusal("ingest", method, ingest_view=False).startswith("This API token's scope is ingest:")


def test_an_unknown_scope_is_refused():
    assert "unknown scope 'admin'" in scope_refusal("admin", "GET", ingest_view=False)


def test_a_token_creates_tokens_no_broader_than_itself():
    assert [other for other in ("read", "write", "ingest") if covers("write", other)] == ["read", "write", "ingest"]
    assert [other for other in ("read", "write", "ingest") if covers("read", other)] == ["read"]
    assert [other for other in ("read", "write", "ingest") if covers("ingest", other)] == ["ingest"]
    assert not covers("nonsense", "read")


@pytest.mark.parametrize(("text", "lifetime"), [
    ("90d", timedelta(days=90)), ("12h", timedelta(hours=12)), ("2w", timedelta(weeks=2)),
    (" 1D ", timedelta(days=1)), ("10000w", timedelta(weeks=10_000)),
])
def test_lifetimes(text, lifetime):
    assert parse_lifetime(text) == lifetime


@pytest.mark.parametrize(("text", "message"), [
    ("90", "'90' has no unit: write 90d (days), 90h (hours) or 90w (weeks)."),
    ("0d", "'0d': a lifetime is 1 to 10,000 days."),
    ("10001w", "'10001w': a lifetime is 1 to 10,000 weeks."),
    ("90y", "'90y' is not a lifetime such as 90d, 12h or 2w (days, hours, weeks)."),
    ("-1d", "'-1d' is not a lifetime"),
    ("٣d", "'٣d' is not a lifetime"),
    ("9" * 40 + "d", "is not a lifetime"),
    ("", "'' is not a lifetime"),
])
def test_bad_lifetimes_say_what_to_write(text, message):
    with pytest.raises(ParseError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_lifetime(text)


@pytest.mark.parametrize(("text", "expected"), [
    ("90d", NOW + timedelta(days=90)),
    ("2026-06-30", datetime(2026, 6, 29, 22, 0, tzinfo=UTC)),  # 00:00 in Berlin's summer time
    ("2026-06-30T18:00", datetime(2026, 6, 30, 16, 0, tzinfo=UTC)),
    ("2026-06-30 18:00", datetime(2026, 6, 30, 16, 0, tzinfo=UTC)),
    ("2026-06-30T18:00Z", datetime(2026, 6, 30, 18, 0, tzinfo=UTC)),
])
def test_an_expiry_is_a_lifetime_or_a_date_or_time_in_the_servers_zone(text, expected):
    assert parse_expiry(text, now=NOW, default_tz=BERLIN) == expected


@pytest.mark.parametrize(("text", "message"), [
    ("2026-03-02", "'2026-03-02' (a date means 00:00 of that day) is in the past"),
    ("2026-03-02T10:00Z", "'2026-03-02T10:00Z' is in the past: a token must expire in the future."),
    ("1700000000", "'1700000000' has no unit"),
    ("next week", "'next week' is neither a lifetime such as 90d, 12h or 2w (days, hours, weeks) nor"),
    ("2026-02-30", "'2026-02-30' is neither"),
    ("\x00", "is neither"),
])
def test_bad_expiries_say_why(text, message):
    with pytest.raises(ParseError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_expiry(text, now=NOW, default_tz=UTC)


def test_a_created_token_expires_in_the_future_and_no_later_than_the_one_creating_it():
    ceiling = NOW + timedelta(days=30)

    check_expiry(None, now=NOW, tz=UTC)
    check_expiry(NOW + timedelta(days=30), now=NOW, tz=UTC, ceiling=ceiling)
    with pytest.raises(ParseError, match="in the past"):
        check_expiry(NOW, now=NOW, tz=UTC)
    for too_late in (None, ceiling + timedelta(seconds=1)):
        with pytest.raises(ParseError, match="signed with expires on 2026-04-01 12:00 CEST: a token it creates must "
                                             "expire by then"):
            check_expiry(too_late, now=NOW, tz=BERLIN, ceiling=ceiling)


def test_when_shows_the_zone():
    assert when(NOW, UTC) == "2026-03-02 10:00 UTC"
    assert when(NOW, BERLIN) == "2026-03-02 11:00 CET"
