"""The list pages of hosts, GPUs, VMs and artists: what an admin sees in each column, filters and
search, sorting, pages that keep the filters, the CSV export, who may open them, and a query
count that does not grow with the rows shown."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from html.parser import HTMLParser

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from dashboard import listing
from fleet import services
from fleet.models import Host
from fleet.tests.factories import ArtistFactory, GpuFactory, HostFactory, VirtualMachineFactory, profile
from telemetry.models import Agent, GpuSample
from telemetry.tests.rollup_world import studio

pytestmark = pytest.mark.django_db

PAGES = ["/hosts/", "/gpus/", "/vms/", "/artists/"]


class _TableParser(HTMLParser):
    """The text of each body cell of the page's data table, row by row."""

    def __init__(self):
        super().__init__()
        self.rows: list[list[str]] = []
        self.headers: list[str] = []
        self._in_body = False
        self._cell: list[str] | None = None
        self._header: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "tbody":
            self._in_body = True
        elif tag == "tr" and self._in_body:
            self.rows.append([])
        elif tag == "td" and self._in_body:
            self._cell = []
        elif tag == "th":
            self._header = []

    def handle_endtag(self, tag):
        if tag == "tbody":
            self._in_body = False
        elif tag == "td" and self._cell is not None:
            self.rows[-1].append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "th" and self._header is not None:
            self.headers.append(" ".join("".join(self._header).split()).rstrip(" ▲▼"))
            self._header = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._header is not None:
            self._header.append(data)


def table(response) -> _TableParser:
    parser = _TableParser()
    parser.feed(response.content.decode())
    return parser


def table_rows(response) -> list[list[str]]:
    """Each row of the page's table as the text of its cells."""
    return table(response).rows


def first_column(response) -> list[str]:
    return [row[0] for row in table_rows(response)]


def csv_rows(response) -> list[list[str]]:
    """The rows of a streamed CSV response, header first."""
    assert response.streaming, "the export is streamed, not built in memory"
    body = b"".join(response.streaming_content).decode()
    return list(csv.reader(io.StringIO(body)))


@pytest.fixture
def world():
    """render-01 (two L40S: ws-ana with a 12Q on each, ws-bob with a 12Q on the second) and
    render-02 (an idle L40S); an agent on render-01; the first GPU has a fresh sample."""
    world = studio()
    Agent.objects.create(name="agent-render-01", url="http://render-01:9410", host=world.host,
                         last_seen=timezone.now())
    GpuSample.objects.create(gpu=world.gpu_1, ts=timezone.now() - timedelta(seconds=5), util_gpu=73, temp_c=61,
                             fb_used_mib=9000, fb_total_mib=49152)
    return world


# What each page shows --------------------------------------------------------------------


def test_hosts_page_shows_usage_agents_and_links(staff, world):
    response = staff.get("/hosts/")

    assert response.status_code == 200
    parsed = table(response)
    assert parsed.headers == ["Host", "Hypervisor", "GPUs", "vCPUs allocated / threads", "RAM allocated / total",
                              "Agents"]
    assert parsed.rows == [
        ["render-01", "Linux KVM", "2", "16 / 72", "64 / 768 GiB", "agent-render-01: ok"],
        ["render-02", "Linux KVM", "1", "0 / 72", "0 / 768 GiB", "no agent"],
    ]
    html = response.content.decode()
    assert f'href="/hosts/{world.host.pk}/">render-01</a>' in html
    assert 'class="badge ok"' in html


def test_gpus_page_shows_frame_buffer_bar_and_latest_sample(staff, world):
    response = staff.get("/gpus/")

    parsed = table(response)
    assert parsed.headers == ["Host", "PCI bus id", "Model", "Mode", "Size mode", "Frame buffer allocated / physical",
                              "vGPUs", "Utilization", "Temperature"]
    assert parsed.rows == [
        ["render-01", "00000000:3B:00.0", "NVIDIA L40S", "vGPU (shared)", "Equal-size", "12288 / 49152 MiB", "1",
         "73 %", "61 °C"],
        ["render-01", "00000000:5E:00.0", "NVIDIA L40S", "vGPU (shared)", "Equal-size", "24576 / 49152 MiB", "2",
         "no samples yet", "—"],
        ["render-02", "00000000:3B:00.0", "NVIDIA L40S", "vGPU (shared)", "Equal-size", "0 / 49152 MiB", "0",
         "no samples yet", "—"],
    ]
    html = response.content.decode()
    assert 'style="width: 25%"' in html, "the bars are the allocated share"
    assert 'style="width: 50%"' in html
    assert f'href="/gpus/{world.gpu_1.pk}/"' in html
    assert f'href="/hosts/{world.gpu_idle.host_id}/"' in html


def test_gpus_page_marks_an_old_sample(staff, world):
    GpuSample.objects.create(gpu=world.gpu_idle, ts=timezone.now() - timedelta(days=2), util_gpu=5.0, temp_c=30.0)

    html = staff.get("/gpus/", {"host": world.gpu_idle.host_id}).content.decode()

    assert "5 %" in html
    assert "(old)" in html


def test_vms_page_shows_artist_host_and_profiles(staff, world):
    unplaced = VirtualMachineFactory(name="ws-new", artist=None, vcpus=4, ram_gib=16)

    response = staff.get("/vms/")

    parsed = table(response)
    assert parsed.headers == ["VM", "Artist", "Host", "vGPU profiles", "vCPUs", "RAM"]
    assert parsed.rows == [
        ["ws-ana", "Ana", "render-01", "L40S-12Q, L40S-12Q", "8", "32 GiB"],
        ["ws-bob", "Bob", "render-01", "L40S-12Q", "8", "32 GiB"],
        ["ws-new", "unassigned", "not placed", "no vGPU", "4", "16 GiB"],
    ]
    html = response.content.decode()
    assert f'href="/vms/{unplaced.pk}/">ws-new</a>' in html
    assert f'href="/artists/{world.ana.pk}/">Ana</a>' in html


def test_artists_page_shows_user_workflow_and_vm_count(staff, world):
    ArtistFactory(name="Cleo", user=None, workflow="lighting", user_type="heavy")

    response = staff.get("/artists/")

    parsed = table(response)
    assert parsed.headers == ["Artist", "User", "Workflow", "User type", "VMs"]
    assert parsed.rows == [
        ["Ana", world.ana.user.username, "Modeling", "Medium", "1"],
        ["Bob", world.bob.user.username, "Modeling", "Medium", "1"],
        ["Cleo", "no account", "Lighting", "Heavy", "0"],
    ]
    assert f'href="/artists/{world.bob.pk}/">Bob</a>' in response.content.decode()


# Filters and search ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "params", "expected"),
    [
        ("/hosts/", {"q": "ER-02"}, ["render-02"]),
        ("/hosts/", {"hypervisor": "esxi"}, []),
        ("/gpus/", {"q": "bbbb"}, ["render-02"]),
        ("/gpus/", {"q": "5E:00"}, ["render-01"]),
        ("/gpus/", {"q": "render-01"}, ["render-01", "render-01"]),
        ("/vms/", {"q": "bob"}, ["ws-bob"]),
        ("/vms/", {"unplaced": "true"}, []),
        ("/artists/", {"q": "an"}, ["Ana"]),
        ("/artists/", {"workflow": "lighting"}, []),
    ],
)
def test_filters_and_search_narrow_the_rows(staff, world, path, params, expected):
    response = staff.get(path, params)

    assert response.status_code == 200
    assert first_column(response) == expected


def test_filters_by_related_objects_and_search_by_vm_uuid(staff, world):
    assert first_column(staff.get("/gpus/", {"host": world.gpu_idle.host_id})) == ["render-02"]
    assert first_column(staff.get("/vms/", {"artist": world.bob.pk})) == ["ws-bob"]
    assert first_column(staff.get("/vms/", {"q": str(world.vm_ana.uuid)[:13].upper()})) == ["ws-ana"]
    assert first_column(staff.get("/artists/", {"q": world.bob.user.username})) == ["Bob"]


def test_search_box_is_in_the_filter_form_with_the_current_values(staff, world):
    html = staff.get("/gpus/", {"q": "bbbb", "mode": "vgpu"}).content.decode()

    assert 'type="search" name="q" value="bbbb"' in html
    assert '<option value="vgpu" selected>' in html
    assert '<option value="">Any</option>' in html, "an empty choice that reads as a person would say it"
    assert f'<option value="{world.host.pk}">render-01</option>' in html, "hosts offered as choices"


def test_api_takes_the_same_search(admin_api, world):
    """`q` belongs to the shared FilterSet, so automation searches like the page does."""
    body = admin_api.get("/api/v1/vms/", {"q": "BOB"}).json()

    assert [vm["name"] for vm in body["results"]] == ["ws-bob"]


@pytest.mark.parametrize(
    ("path", "params", "message"),
    [
        ("/gpus/", {"host": "999999"}, "Select a valid choice. That choice is not one of the available choices."),
        ("/hosts/", {"hypervisor": "vmsphere"}, "Select a valid choice. vmsphere is not one of the available choices."),
        ("/vms/", {"artist": "abc"}, "Select a valid choice. That choice is not one of the available choices."),
        ("/artists/", {"user_type": "huge"}, "Select a valid choice. huge is not one of the available choices."),
    ],
)
def test_an_invalid_filter_is_a_400_saying_why_and_lists_nothing(staff, world, path, params, message):
    response = staff.get(path, params)

    assert response.status_code == 400
    html = response.content.decode()
    assert "These filters cannot be applied" in html
    assert message in html
    assert table_rows(response) == [], "no list rather than a wrong one"
    assert "Export CSV" not in html


# Ordering ----------------------------------------------------------------------------------


def test_column_headers_sort_and_reverse(staff, world):
    by_fb = staff.get("/gpus/", {"ordering": "-used_fb_mib"})
    assert [row[5] for row in table_rows(by_fb)] == ["24576 / 49152 MiB", "12288 / 49152 MiB", "0 / 49152 MiB"]
    html = by_fb.content.decode()
    assert 'aria-sort="descending"' in html
    assert 'href="/gpus/?ordering=used_fb_mib"' in html, "clicking the sorted column again reverses it"

    assert first_column(staff.get("/hosts/", {"ordering": "-name"})) == ["render-02", "render-01"]
    assert first_column(staff.get("/vms/", {"ordering": "-vcpus"})) == ["ws-bob", "ws-ana"], "id tiebreak, reversed"
    assert first_column(staff.get("/artists/", {"ordering": "-name"})) == ["Bob", "Ana"]


def test_sorting_keeps_the_filters_and_ignores_unknown_keys(staff, world):
    html = staff.get("/gpus/", {"host": world.host.pk, "page": "1"}).content.decode()
    assert f'href="/gpus/?host={world.host.pk}&amp;ordering=pci_bus_id"' in html, "filters kept, page dropped"

    unknown = staff.get("/hosts/", {"ordering": "cpu_model; DROP TABLE"})
    assert unknown.status_code == 200
    assert first_column(unknown) == ["render-01", "render-02"]


def test_equal_values_keep_a_stable_order_across_pages(staff):
    """Sixty hosts with the same thread count: pages split them by id, none repeated or lost."""
    HostFactory.create_batch(60, cpu_threads=64)

    first = first_column(staff.get("/hosts/", {"ordering": "cpu_threads"}))
    second = first_column(staff.get("/hosts/", {"ordering": "cpu_threads", "page": "2"}))

    assert len(first) == 50
    assert len(second) == 10
    assert sorted(first + second) == sorted(Host.objects.values_list("name", flat=True))


# Pagination ----------------------------------------------------------------------------------


def test_pages_of_50_with_links_that_keep_the_filters(staff):
    for n in range(60):
        HostFactory(name=f"farm-{n:03d}")
    HostFactory(name="edit-bay")

    first = staff.get("/hosts/", {"q": "farm", "ordering": "-name"})
    html = first.content.decode()
    assert len(table_rows(first)) == 50
    assert "1–50 of 60 hosts" in html
    assert 'href="/hosts/?q=farm&amp;ordering=-name&amp;page=2" rel="next"' in html
    assert first_column(first)[0] == "farm-059"

    second = staff.get("/hosts/", {"q": "farm", "ordering": "-name", "page": "2"})
    html = second.content.decode()
    assert first_column(second) == [f"farm-{n:03d}" for n in range(9, -1, -1)]
    assert "51–60 of 60 hosts" in html
    assert 'href="/hosts/?q=farm&amp;ordering=-name&amp;page=1" rel="prev"' in html
    assert 'rel="next"' not in html
    assert 'name="ordering" value="-name"' in html, "filtering again keeps the sort"


def test_a_page_past_the_end_shows_the_last_page(staff):
    HostFactory.create_batch(3)

    response = staff.get("/hosts/", {"page": "99"})

    assert response.status_code == 200
    assert len(table_rows(response)) == 3


# CSV export ------------------------------------------------------------------------------------


def test_csv_export_has_every_filtered_row_in_order(staff):
    for n in range(60):
        HostFactory(name=f"farm-{n:03d}", ram_gib=512)
    HostFactory(name="edit-bay")

    response = staff.get("/hosts/", {"q": "farm", "ordering": "-name", "page": "1", "format": "csv"})

    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"] == f'attachment; filename="hosts-{timezone.now():%Y-%m-%d}.csv"'
    rows = csv_rows(response)
    assert rows[0] == ["name", "hypervisor", "gpus", "vcpus_allocated", "cpu_threads", "ram_allocated_gib", "ram_gib",
                       "agents"]
    assert [row[0] for row in rows[1:]] == [f"farm-{n:03d}" for n in range(59, -1, -1)], "all pages, not one"
    assert rows[1][1:] == ["kvm", "0", "0", "72", "0", "512", ""]


def test_export_link_carries_the_filters(staff, world):
    html = staff.get("/vms/", {"q": "ws", "host": world.host.pk, "page": "1", "ordering": "-name"}).content.decode()

    assert f'href="/vms/?q=ws&amp;host={world.host.pk}&amp;ordering=-name&amp;format=csv"' in html
    assert "Export CSV" in html


def test_csv_of_gpus_vms_and_artists_carry_units_and_figures(staff, world):
    gpus = csv_rows(staff.get("/gpus/", {"format": "csv"}))
    assert gpus[0] == ["host", "pci_bus_id", "uuid", "model", "mode", "size_mode", "fb_allocated_mib",
                       "fb_physical_mib", "vgpus", "util_gpu_pct", "temp_c", "sampled_at_utc"]
    assert gpus[1][:11] == ["render-01", "00000000:3B:00.0", "GPU-aaaa-0001", "NVIDIA L40S", "vgpu", "equal",
                            "12288", "49152", "1", "73", "61"]
    assert gpus[1][11].endswith("+00:00")
    assert gpus[3][9:] == ["", "", ""], "no sample: empty cells, not zeros"

    vms = csv_rows(staff.get("/vms/", {"format": "csv"}))
    assert vms[0] == ["name", "uuid", "artist", "host", "profiles", "vgpu_fb_mib", "vcpus", "ram_gib"]
    assert vms[1] == ["ws-ana", str(world.vm_ana.uuid), "Ana", "render-01", "L40S-12Q; L40S-12Q", "24576", "8", "32"]

    artists = csv_rows(staff.get("/artists/", {"format": "csv", "q": "bob"}))
    assert artists == [["name", "username", "workflow", "user_type", "vms"],
                       ["Bob", world.bob.user.username, "modeling", "medium", "1"]]


def test_csv_decorates_every_chunk(staff, world, monkeypatch):
    """Rows stream in chunks; each chunk gets its latest samples, so no GPU loses them."""
    monkeypatch.setattr(listing, "CSV_CHUNK_ROWS", 2)
    GpuSample.objects.create(gpu=world.gpu_idle, ts=timezone.now(), util_gpu=11, temp_c=40)

    rows = csv_rows(staff.get("/gpus/", {"format": "csv"}))

    assert [row[9] for row in rows[1:]] == ["73", "", "11"]


def test_csv_neutralizes_formulas_in_names(staff):
    ArtistFactory(name="=HYPERLINK(\"http://evil\",\"x\")", user=None)
    ArtistFactory(name="@SUM(A1)", user=None)
    ArtistFactory(name="Plain -dash", user=None)
    VirtualMachineFactory(name="+cmd|' /C calc'!A0", artist=None)

    artists = csv_rows(staff.get("/artists/", {"format": "csv"}))
    vms = csv_rows(staff.get("/vms/", {"format": "csv"}))

    names = [row[0] for row in artists[1:]]
    assert "'=HYPERLINK(\"http://evil\",\"x\")" in names
    assert "'@SUM(A1)" in names
    assert "Plain -dash" in names, "only a leading sign is a formula"
    assert vms[1][0] == "'+cmd|' /C calc'!A0"


def test_an_unknown_format_is_a_400_naming_it(staff, world):
    response = staff.get("/vms/", {"format": "xlsx"})

    assert response.status_code == 400
    assert "Format: Select a valid choice. xlsx is not one of the available choices." in response.content.decode()
    assert table_rows(response) == []


def test_csv_with_invalid_filters_is_the_400_page(staff, world):
    response = staff.get("/gpus/", {"host": "999999", "format": "csv"})

    assert response.status_code == 400
    assert "These filters cannot be applied" in response.content.decode()


# Empty states ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "title", "add_url"),
    [
        ("/hosts/", "No hosts yet", "/admin/fleet/host/add/"),
        ("/gpus/", "No GPUs yet", "/admin/fleet/gpu/add/"),
        ("/vms/", "No VMs yet", "/admin/fleet/virtualmachine/add/"),
        ("/artists/", "No artists yet", "/admin/fleet/artist/add/"),
    ],
)
def test_an_empty_fleet_says_where_rows_come_from(staff, path, title, add_url):
    response = staff.get(path)

    assert response.status_code == 200
    html = response.content.decode()
    assert title in html
    assert f'href="{add_url}"' in html
    assert "manage.py seed_demo" in html


def test_a_filter_matching_nothing_offers_a_reset(staff, world):
    html = staff.get("/hosts/", {"q": "no-such-host"}).content.decode()

    assert "No hosts match these filters" in html
    assert '<a class="button" href="/hosts/">Reset filters</a>' in html
    assert "No hosts yet" not in html


# Who may open the pages -----------------------------------------------------------------------


@pytest.mark.parametrize("path", PAGES)
def test_artists_get_403_and_anonymous_visitors_the_login_page(client, artist, path):
    anonymous = client.get(path)
    assert anonymous.status_code == 302
    assert anonymous["Location"] == f"/login/?next={path}"

    client.force_login(artist.user)
    for params in ({}, {"format": "csv"}):
        refused = client.get(path, params)
        assert refused.status_code == 403
        assert "only fleet admins" in refused.content.decode()


# Query counts --------------------------------------------------------------------------------------


def add_rows(count: int, start: int) -> None:
    """`count` hosts, each with a GPU holding one vGPU of a VM of a new artist, an agent and a sample."""
    q12 = profile("L40S-12Q")
    for n in range(start, start + count):
        host = HostFactory(name=f"qc-host-{n:03d}")
        gpu = GpuFactory(host=host, gpu_model=q12.gpu_model)
        vm = VirtualMachineFactory(name=f"qc-vm-{n:03d}", artist=ArtistFactory(name=f"qc-artist-{n:03d}"))
        services.place_vgpu(vm, gpu, q12)
        Agent.objects.create(name=f"qc-agent-{n:03d}", url=f"http://qc-{n}:9410", host=host, last_seen=timezone.now())
        GpuSample.objects.create(gpu=gpu, ts=timezone.now(), util_gpu=50.0, temp_c=55.0)


def count_queries(client, path: str, params: dict) -> int:
    with CaptureQueriesContext(connection) as context:
        response = client.get(path, params)
        if response.streaming:
            b"".join(response.streaming_content)
    assert response.status_code == 200
    return len(context.captured_queries)


# session, user, count, page, then: agents of the page's hosts / the page's GPU samples / the VMs'
# vGPUs / -, plus the choices of the filter form's selects.
EXPECTED_QUERIES = {"/hosts/": 6, "/gpus/": 8, "/vms/": 8, "/artists/": 5}
# session, user, the rows, then what `decorate` or a prefetch adds per chunk of rows, and the
# navigation badges (dashboard.context_processors).
EXPECTED_CSV_QUERIES = {"/hosts/": 4, "/gpus/": 4, "/vms/": 4, "/artists/": 3}


@pytest.mark.parametrize("path", PAGES)
def test_query_count_does_not_grow_with_rows(staff, path, django_assert_num_queries):
    add_rows(2, start=0)
    with django_assert_num_queries(EXPECTED_QUERIES[path]):
        assert len(table_rows(staff.get(path))) == 2
    small_csv = count_queries(staff, path, {"format": "csv"})

    add_rows(10, start=2)
    with django_assert_num_queries(EXPECTED_QUERIES[path]):
        assert len(table_rows(staff.get(path))) == 12
    assert count_queries(staff, path, {"format": "csv"}) == small_csv == EXPECTED_CSV_QUERIES[path]
    assert count_queries(staff, path, {"q": "qc", "ordering": "-name"}) == EXPECTED_QUERIES[path]
