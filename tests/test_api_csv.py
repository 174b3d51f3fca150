"""`?format=csv` on every API list, through the one CSV writer (config/csv_export.py): a table of
every row the filters match, cells a spreadsheet will not run as formulas."""

import csv
import io

import pytest
from django.urls import reverse

from fleet.api import urls as fleet_api
from fleet.tests.factories import HostFactory, VirtualMachineFactory
from sizing.api import urls as sizing_api
from telemetry.api import urls as telemetry_api

LISTS = sorted(
    (prefix, basename)
    for router in (fleet_api.router, telemetry_api.router, sizing_api.router)
    for prefix, _, basename in router.registry
)


def table(response) -> list[dict]:
    assert response.status_code == 200, response.content[:300]
    assert response["Content-Type"].startswith("text/csv")
    return list(csv.DictReader(io.StringIO(b"".join(response).decode() if response.streaming
                                           else response.content.decode())))


@pytest.mark.parametrize(("prefix", "basename"), LISTS, ids=[prefix for prefix, _ in LISTS])
def test_every_list_exports_csv(admin_api, fleet_world, prefix, basename):
    response = admin_api.get(reverse(f"{basename}-list"), {"format": "csv"})

    table(response)
    assert response["Content-Disposition"].startswith("attachment; filename=")


def test_a_csv_export_holds_every_matching_row_not_a_page(admin_api, db):
    for n in range(60):
        HostFactory(name=f"node-{n:02d}")
    HostFactory(name="edit-01")

    rows = table(admin_api.get("/api/v1/hosts/", {"format": "csv", "name": "node", "ordering": "name"}))

    assert len(rows) == 60, "more than one page (50), and only what the filter matched"
    assert rows[0]["name"] == "node-00"
    assert {"id", "name", "hypervisor", "cpu_threads", "ram_gib", "gpu_count"} <= set(rows[0])


def test_csv_cells_are_neutralised_and_nested_objects_flattened(admin_api, fleet_world):
    VirtualMachineFactory(name='=HYPERLINK("http://x","click")', artist=fleet_world.ana)

    rows = table(admin_api.get("/api/v1/vms/", {"format": "csv", "expand": "artist,host", "ordering": "name"}))

    assert rows[0]["name"] == "'=HYPERLINK(\"http://x\",\"click\")", "a formula is shown as text"
    assert rows[0]["artist.display"] == "Ana Artist"
    by_name = {row["name"]: row for row in rows}
    assert by_name["ws-ana"]["host.display"] == "host-a"
    assert '"profile"' in by_name["ws-ana"]["vgpus"], "a list is its JSON in one cell"


def test_csv_of_a_bad_filter_is_the_400_as_field_value_rows(admin_api, db):
    response = admin_api.get("/api/v1/hosts/", {"format": "csv", "hots": "=1"})

    assert response.status_code == 400
    assert response.content.decode().splitlines()[0] == "field,value"


def test_the_hosts_csv_suffix_route_is_the_same_export(admin_api, fleet_world):
    assert table(admin_api.get("/api/v1/hosts.csv")) == table(admin_api.get("/api/v1/hosts/", {"format": "csv"}))


def test_the_schema_offers_csv(admin_api, db):
    schema = admin_api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()

    assert "text/csv" in schema["paths"]["/api/v1/hosts/"]["get"]["responses"]["200"]["content"]
    assert "csv" in {p["name"]: p for p in schema["paths"]["/api/v1/hosts/"]["get"]["parameters"]}["format"]["schema"][
        "enum"]
