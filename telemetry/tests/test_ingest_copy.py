"""Samples reach their tables as the agent sent them, at the very edges of what the payload admits.

On PostgreSQL the samples go in by binary COPY (`telemetry.ingest._copy_rows`), which writes each
value as its column's type and, unlike text COPY, does not refuse an integer too large for a
`smallint` or `integer` column: it stores the low bytes. So every sample column must hold every
value the payload lets through, and the payload must refuse the rest: checked here on each
column's type, and end to end with a report at every bound.
"""

from __future__ import annotations

import pytest
from django.db import connection

from telemetry import payload
from telemetry.ingest import GPU_SAMPLE_COLUMNS, VGPU_SAMPLE_COLUMNS, sample_time, store_reports
from telemetry.models import GpuSample, VgpuSample
from telemetry.payload import PayloadError, parse_agent_payload
from telemetry.tests.ingest_world import T0, l40s_world

pytestmark = pytest.mark.django_db

PERCENT = (0, 100)
#: The bounds `telemetry.payload` checks each sample column's reading against.
BOUNDS = {
    "util_gpu": PERCENT, "util_mem": PERCENT, "enc_util": PERCENT, "dec_util": PERCENT,
    "fb_used_mib": (0, payload.MAX_FB_MIB), "fb_total_mib": (0, payload.MAX_FB_MIB),
    "temp_c": (payload.MIN_TEMP_C, payload.MAX_TEMP_C), "power_w": (0, payload.MAX_POWER_W),
    "sm_clock_mhz": (0, payload.MAX_CLOCK_MHZ), "clocks_event_reasons": (0, payload.MAX_COUNT),
}
KEYS = {"gpu_id", "vm_id", "vgpu_id", "ts"}
WHOLE_RANGES = {"smallint": 2**15 - 1, "integer": 2**31 - 1, "bigint": 2**63 - 1}


@pytest.mark.parametrize(("model", "columns"), [(GpuSample, GPU_SAMPLE_COLUMNS), (VgpuSample, VGPU_SAMPLE_COLUMNS)])
def test_every_sample_column_holds_every_value_the_payload_admits(model, columns):
    fields = {field.column: field for field in model._meta.concrete_fields}
    for column in columns:
        if column in KEYS:
            continue
        assert column in BOUNDS, f"{model.__name__}.{column}: no payload bound known for it (add it above)"
        db_type = fields[column].db_type(connection)
        if db_type in WHOLE_RANGES:
            low, high = BOUNDS[column]
            assert -WHOLE_RANGES[db_type] <= low, f"{model.__name__}.{column} ({db_type}) cannot hold {low}"
            assert high <= WHOLE_RANGES[db_type], f"{model.__name__}.{column} ({db_type}) cannot hold {high}"
        else:
            assert db_type in ("real", "double precision"), f"{model.__name__}.{column}: unexpected {db_type}"


def body(world, **gpu) -> dict:
    """render-01's report of its first L40S (ws-lighting-01's vGPU on it), the GPU's fields
    overridden by `gpu` and the vGPU's taken from them."""
    fields = dict(util_gpu=38, util_mem=21, fb_total_mib=46068, fb_used_mib=14336, enc_util=4, dec_util=0, temp_c=52,
                  power_w=161.2, sm_clock_mhz=2490, clocks_event_reasons=4)
    fields.update(gpu)
    vgpu = {name: fields[name] for name in ("util_gpu", "util_mem", "fb_used_mib", "enc_util", "dec_util")}
    return {
        "agent": {"version": "1.0", "hostname": "render-01", "backend": "nvml"},
        "collected_at": T0,
        "gpus": [{"uuid": world.gpu.uuid, "index": 0, "name": "NVIDIA L40S", "pci_bus_id": world.gpu.pci_bus_id,
                  "virtualization_mode": "vgpu_host", **fields,
                  "vgpus": [{"vgpu_uuid": "3251634213", "vm_uuid": str(world.lighting.uuid),
                             "vm_name": "ws-lighting-01", "type_name": "NVIDIA L40S-12Q", **vgpu}]}],
    }


HIGHEST = {name: high for name, (_, high) in BOUNDS.items()}
LOWEST = {name: low for name, (low, _) in BOUNDS.items()}


@pytest.mark.parametrize("edge", [HIGHEST, LOWEST], ids=["highest", "lowest"])
def test_a_report_at_the_payloads_bounds_is_stored_as_sent(edge):
    world = l40s_world()
    report = parse_agent_payload(body(world, **edge))

    stats = store_reports([(world.agent, report)], received_at=T0)

    assert stats.errors == {}
    gpu_row = GpuSample.objects.filter(gpu=world.gpu, ts=sample_time(T0)).values(*BOUNDS).get()
    assert gpu_row == {name: pytest.approx(value) for name, value in edge.items()}
    vgpu_row = VgpuSample.objects.filter(vm=world.lighting).values(
        "util_gpu", "util_mem", "fb_used_mib", "enc_util", "dec_util").get()
    assert vgpu_row == {name: edge[name] for name in vgpu_row}


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_a_reading_past_its_bound_is_refused_before_it_reaches_a_table(name):
    world = l40s_world()
    low, high = BOUNDS[name]
    too_high = dict(HIGHEST, **{name: high * 2 + 1})
    with pytest.raises(PayloadError, match=name):
        parse_agent_payload(body(world, **too_high))
    too_low = dict(LOWEST, **{name: low - 1 if low else -1})
    with pytest.raises(PayloadError, match=name):
        parse_agent_payload(body(world, **too_low))
    assert not GpuSample.objects.exists()
