"""CSV exports against formula injection (CSV injection), tried as an attacker would.

Every text a user, an API client or an agent can set (host, VM, artist and user names, GPU
UUIDs, an agent's name and its last error, a suggestion's reason, an audit event's actor,
object, comment and before/after) is stored as a formula, one of each kind a spreadsheet runs:
`=`, `+`, `-`, `@`, and `=` behind a tab or a carriage return. Then every CSV the site serves
is downloaded as an admin would, parsed with the csv module and checked: no cell starts with a
character that makes a formula, each payload is still there behind a single quote, and the
negative numbers stay numbers. The URL resolver and the sources are walked, so an export added
without a line here fails `test_every_csv_export_is_listed`.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.conf import settings
from django.urls import get_resolver
from django.utils import timezone
from rest_framework.views import APIView

from alerts.evaluate import ensure_rules
from alerts.models import Alert
from dashboard.listing import TableListView
from fleet import services
from fleet.models import AuditEvent
from fleet.tests.factories import ArtistFactory, GpuFactory, HostFactory, UserFactory, VirtualMachineFactory, profile
from notify.models import Delivery, NotificationChannel
from sizing.models import Suggestion, SuggestionAction
from telemetry.models import Agent
from tests.test_security_matrix import template_of, walk

pytestmark = pytest.mark.django_db

PAYLOADS = ('=HYPERLINK("http://x")', "+1+1", "-2+3", "@SUM(A1)", "\t=1", "\r=1")
#: What a spreadsheet runs as a formula at the start of a cell (OWASP, CSV injection).
DANGEROUS = ("=", "+", "-", "@", "\t", "\r")
NEGATIVE_SKEW_S = -2.5
NEGATIVE_GPUS_DELTA = -1
#: A before snapshot that is a bare JSON number: its cell's text starts with "-".
NEGATIVE_SNAPSHOT = -3


@pytest.fixture
def evil(admin_user):
    """For each payload: a user and artist, a host with a GPU, a VM holding a vGPU on it, an
    agent that failed with the payload as its error, a suggestion whose reason it is, and an
    audit event written by someone of that name, all named by the payload."""
    now = timezone.now()
    rules = ensure_rules()
    channel = NotificationChannel.objects.create(name="admins", kind="in_app")
    for i, text in enumerate(PAYLOADS):
        artist = ArtistFactory(user=UserFactory(username=text), name=text)
        host = HostFactory(name=text)
        gpu = GpuFactory(host=host, uuid=text, pci_bus_id=f"00000000:{i + 16:02X}:00.0")
        vm = VirtualMachineFactory(name=text, artist=artist)
        services.place_vgpu(vm, gpu, profile("RTX6000-12Q"))
        Agent.objects.create(name=text, url=f"http://render-{i}:9410", host=host, last_error=text,
                             last_error_at=now, clock_skew_s=NEGATIVE_SKEW_S)
        Suggestion.objects.create(
            vm=vm, current_profile=profile("RTX6000-12Q"), suggested_profile=profile("RTX6000-6Q"),
            action=SuggestionAction.DOWNSIZE, reason=text, evidence={}, evidence_key=f"k{i}",
            gpus_delta=NEGATIVE_GPUS_DELTA, window_start=now, window_end=now, computed_at=now,
        )
        AuditEvent.objects.create(at=now, actor_name=text, action="host.update", object_type="host",
                                  object_id=str(host.pk), object_repr=text, before=NEGATIVE_SNAPSHOT,
                                  after={"name": text}, comment=text)
        Alert.objects.create(rule=rules["xid"], key=f"xid:gpu:{gpu.pk}:79", severity="critical", title=text,
                             summary=text, host=host, gpu=gpu)
        Delivery.objects.create(channel=channel, channel_name=text, kind="in_app", key=f"alert:{i}", event="firing",
                                severity="critical", rule="xid", title=text, status="failed", last_error=text)
    return SimpleNamespace(event=AuditEvent.objects.filter(actor_name=PAYLOADS[0]).get())


def body_of(response) -> str:
    raw = b"".join(response.streaming_content) if response.streaming else response.content
    return raw.decode()


def download(client, url: str, status: int = 200) -> list[list[str]]:
    """The rows of a CSV answer, header first."""
    response = client.get(url)
    assert response.status_code == status, body_of(response)[:500]
    assert response["Content-Type"].startswith("text/csv"), response["Content-Type"]
    return list(csv.reader(io.StringIO(body_of(response), newline="")))


def audit_page_export(client, w) -> str:
    """The "Export CSV" link of /audit/, as an admin clicks it."""
    page = client.get("/audit/").content.decode()
    return re.search(r'href="([^"]*format=csv[^"]*)"', page).group(1).replace("&amp;", "&")


#: Every CSV export (its resolver route) -> the URLs that download it (given the admin's client
#: and the fixture), and the columns that carry a payload as it was given.
EXPORTS: dict[str, tuple[list[Callable], tuple[str, ...]]] = {
    "hosts/": ([lambda c, w: "/hosts/?format=csv"], ("name",)),
    "gpus/": ([lambda c, w: "/gpus/?format=csv"], ("host", "uuid")),
    "vms/": ([lambda c, w: "/vms/?format=csv"], ("name", "artist", "host")),
    "artists/": ([lambda c, w: "/artists/?format=csv"], ("name", "username")),
    "agents/": ([lambda c, w: "/agents/?format=csv"], ("name", "host", "last_error")),
    "sizing/suggestions/": ([lambda c, w: "/sizing/suggestions/?format=csv"], ("vm", "artist", "host", "reason")),
    "alerts/": ([lambda c, w: "/alerts/?format=csv"], ("title", "host")),
    "alerts/deliveries/": ([lambda c, w: "/alerts/deliveries/?format=csv"], ("channel_name", "title", "last_error")),
    "api/v1/audit-events/": ([lambda c, w: "/api/v1/audit-events/?format=csv", audit_page_export,
                              lambda c, w: "/api/v1/audit-events.csv"], ("actor", "object", "comment")),
    "api/v1/audit-events/{pk}/": ([lambda c, w: f"/api/v1/audit-events/{w.event.pk}/?format=csv",
                                   lambda c, w: f"/api/v1/audit-events/{w.event.pk}.csv"], ()),
}


NUMBER = re.compile(r"-?\d+(\.\d+)?")


def formula_cells(rows: list[list[str]]) -> list[str]:
    """Cells a spreadsheet would run: those starting with a DANGEROUS character, but for plain
    numbers (a negative number is a value, written so on purpose)."""
    return [cell for row in rows for cell in row if cell.startswith(DANGEROUS) and not NUMBER.fullmatch(cell)]


def assert_safe_and_kept(url: str, rows: list[list[str]], columns: tuple[str, ...]) -> None:
    """No cell of `rows` is a formula, and each payload is in each of `columns` behind a quote."""
    assert len(rows) > 1, f"{url} exported nothing"
    assert not formula_cells(rows), f"{url} exports formulas: {formula_cells(rows)}"
    header, *data = rows
    for column in columns:
        values = {row[header.index(column)] for row in data}
        missing = {"'" + text for text in PAYLOADS} - values
        assert not missing, f"{url} column {column}: {missing} not kept behind a quote"


def test_no_cell_of_any_export_is_a_formula_and_every_text_is_kept(staff, evil):
    for urls, columns in EXPORTS.values():
        for url_of in urls:
            url = url_of(staff, evil)
            assert_safe_and_kept(url, download(staff, url), columns)


#: The API's lists whose rows carry text a user, a client or an agent sets: `?format=csv` of each
#: (config.csv_export.CsvRenderer, the default renderer of every API view), names expanded.
API_LISTS = {
    "hosts": ("name",), "gpus": ("uuid", "host.display"), "vms": ("name", "artist.display", "host.display"),
    "artists": ("name", "user.display"), "agents": ("name", "last_error", "host.display"),
    "suggestions": ("vm_name", "reason"),
}


def test_no_cell_of_any_api_list_is_a_formula(staff, evil):
    for resource, columns in API_LISTS.items():
        extra = {"hosts": "", "suggestions": "&dismissed=all"}.get(resource, "&expand=all")
        url = f"/api/v1/{resource}/?format=csv{extra}"
        assert_safe_and_kept(url, download(staff, url), columns)


def test_audit_json_cells_are_checked_on_their_final_text(staff, evil):
    """before/after are JSON dumped into a cell: a snapshot that is a negative number dumps to
    text starting with "-", and gets the quote like any other text; an object dump starts with
    "{" and keeps the payload inside it as it was."""
    header, *data = download(staff, "/api/v1/audit-events/?format=csv&action=host.update")
    befores = {row[header.index("before")] for row in data}
    afters = {row[header.index("after")] for row in data}

    assert befores == {f"'{NEGATIVE_SNAPSHOT}"}
    assert '{"name": "=HYPERLINK(\\"http://x\\")"}' in afters
    assert '{"name": "\\t=1"}' in afters  # json.dumps writes the tab as \t: text, not a tab


def test_one_event_and_error_answers_in_csv_carry_no_formula(staff, evil, artist_api):
    """`?format=csv` on one event is a `field,value` list; an error answers in CSV too, and its
    message, which echoes what the caller typed (a link mailed to an admin), is neutralised."""
    rows = download(staff, f"/api/v1/audit-events/{evil.event.pk}/?format=csv")
    values = dict(rows[1:])
    assert values["object_repr"] == "'" + PAYLOADS[0]
    assert values["after.name"] == "'" + PAYLOADS[0]
    assert values["before"] == str(NEGATIVE_SNAPSHOT), "a number stays a number"

    # Answered as JSON text, the commas typed here would split the message into cells, one of
    # them `=HYPERLINK(...)`; as CSV the message is one cell that starts with Django's words.
    typed = 'x,=HYPERLINK("http://x"),@SUM(A1)'
    errors = download(staff, f"/api/v1/audit-events/?format=csv&source={typed}", status=400)
    assert errors[0] == ["field", "value"]
    assert errors[1][0] == "source"
    assert typed in errors[1][1]
    assert not formula_cells(errors), errors

    denied = artist_api.get("/api/v1/audit-events/?format=csv")
    assert denied.status_code == 403
    assert not formula_cells(list(csv.reader(io.StringIO(denied.content.decode(), newline=""))))


def test_the_poc_studys_export_carries_no_formula_and_keeps_every_name(staff, evil):
    """The study's CSV (a page's own export, not a list's) names VMs, hosts and artists."""
    url = "/sizing/study.csv"
    assert_safe_and_kept(url, download(staff, url), ("name", "host", "artist"))


def test_negative_numbers_stay_numbers(staff, evil):
    """Numbers given as numbers are written as they are: a spreadsheet reads -2.5 as a value."""
    header, *agents = download(staff, "/agents/?format=csv")
    assert {row[header.index("clock_skew_s")] for row in agents} == {str(NEGATIVE_SKEW_S)}
    header, *suggestions = download(staff, "/sizing/suggestions/?format=csv")
    assert {row[header.index("gpus_delta")] for row in suggestions} == {str(NEGATIVE_GPUS_DELTA)}


# Coverage: every CSV the site can serve is listed above ----------------------------------

APP_DIRS = ("config", "fleet", "telemetry", "sizing", "hypervisors", "notify", "alerts", "dashboard")
#: The one module that writes CSV, and the modules that serve its exports (their URLs are above).
CSV_WRITER = "config/csv_export.py"
#: The list pages, the audit log's streamed export, and the API's default renderers (settings).
CSV_SERVERS = {"dashboard/listing.py", "fleet/api/audit.py", "config/settings.py", "dashboard/views/study.py"}


def csv_routes() -> set[str]:
    """Routes whose view can answer CSV: a list page (`?format=csv`), or a DRF view with a
    renderer of format csv (format-suffix twins such as `audit-events.{format}` fold into
    their route)."""
    found = set()
    for route, pattern in walk(get_resolver().url_patterns):
        view = getattr(pattern.callback, "cls", None) or getattr(pattern.callback, "view_class", None)
        if view is None:
            continue
        renderers = getattr(view, "renderer_classes", ())
        if renderers is APIView.renderer_classes:
            continue  # the API's default renderers: every list, checked by test_no_cell_of_any_api_list_is_a_formula
        if ((issubclass(view, TableListView) and view.csv_name)
                or any(getattr(r, "format", None) == "csv" or "csv" in getattr(r, "media_type", "")
                       for r in renderers)):
            template = template_of(route)
            found.add(re.sub(r"\.\{format\}/?$", "/", template) if "{format}" in template else template)
    return found


def sources() -> dict[str, str]:
    root = Path(settings.BASE_DIR)
    return {
        str(path.relative_to(root)): path.read_text()
        for app in APP_DIRS for path in (root / app).rglob("*.py")
        if "tests" not in path.relative_to(root).parts and "migrations" not in path.relative_to(root).parts
    }


def test_every_csv_export_is_listed():
    routes = csv_routes()
    assert routes - set(EXPORTS) == set(), "CSV exports missing from EXPORTS above"
    assert set(EXPORTS) - routes == set(), "listed exports that no longer answer CSV"

    code = sources()
    writers = {path for path, text in code.items()
               if re.search(r"^\s*(import csv\b|from csv import)", text, re.M) or "text/csv" in text}
    assert writers == {CSV_WRITER}, "CSV written outside config/csv_export.py, where cells are made safe"
    servers = {path for path, text in code.items() if "csv_export" in text and path != CSV_WRITER}
    assert servers == CSV_SERVERS, "a new module serves CSV: list its URLs in EXPORTS and here"
