"""dcgm-exporter scrapes: GPUs keyed by UUID with the fields we chart; bad text is refused."""

from __future__ import annotations

import pytest

from telemetry.payload import PayloadError
from telemetry.sources.dcgm import parse_dcgm_metrics
from telemetry.tests.ingest_world import OWN_FIXTURES

SCRAPE = OWN_FIXTURES / "dcgm-exporter" / "render-07-l40s.prom"
LABELS = ('gpu="{gpu}",UUID="{uuid}",pci_bus_id="00000000:3B:00.0",device="nvidia{gpu}",'
          'modelName="NVIDIA A100 80GB PCIe",Hostname="dgx-01"')


def test_fixture_scrape_gives_every_gpu_with_its_values():
    report = parse_dcgm_metrics(SCRAPE.read_bytes(), collected_at=1_780_000_000.0)

    assert (report.hostname, report.backend, report.collected_at) == ("render-07", "dcgm-exporter", 1_780_000_000.0)
    assert report.guest_vgpus == []
    first, second, idle = report.gpus
    assert (first.uuid, first.index, first.name, first.pci_bus_id) == (
        "GPU-2f6b0a3e-7c41-4d9a-b1e2-8f3c5d7a9b10", 0, "NVIDIA L40S", "00000000:3B:00.0")
    # dcgm-exporter has no total: used + free.
    assert (first.fb_used_mib, first.fb_total_mib) == (26645, 26645 + 18911)
    assert (first.util_gpu, first.util_mem, first.enc_util, first.dec_util) == (71, 34, 12, 0)
    assert (first.temp_c, first.power_w, first.sm_clock_mhz) == (61, 212.468, 2235)
    assert first.virtualization_mode is None
    assert first.vgpus == []
    assert (second.uuid, second.pci_bus_id, second.util_gpu, second.dec_util) == (
        "GPU-9a1c4e7d-2b58-4f36-8d0e-6c1b3a5f7e92", "00000000:5E:00.0", 43, 3)
    assert (idle.index, idle.util_gpu, idle.fb_used_mib, idle.power_w) == (2, 0, 0, 35.117)


def test_hostname_argument_overrides_the_exporters_label():
    # In Kubernetes the Hostname label names the exporter's pod, not the server.
    report = parse_dcgm_metrics(SCRAPE.read_text(), hostname="render-07.studio.lan", collected_at=1.0)
    assert report.hostname == "render-07.studio.lan"


def _series(name: str, value: str, gpu: int = 0, uuid: str = "GPU-a100", extra: str = "") -> str:
    return f"{name}{{{LABELS.format(gpu=gpu, uuid=uuid)}{extra}}} {value}\n"


def test_reserved_frame_buffer_counts_in_the_total_and_missing_fields_are_null():
    text = (_series("DCGM_FI_DEV_FB_USED", "50") + _series("DCGM_FI_DEV_FB_FREE", "81001")
            + _series("DCGM_FI_DEV_FB_RESERVED", "869") + _series("DCGM_FI_DEV_GPU_UTIL", "NaN"))

    (gpu,) = parse_dcgm_metrics(text, collected_at=1.0).gpus

    assert gpu.fb_total_mib == 81920
    assert gpu.util_gpu is None  # NaN: no value
    assert (gpu.enc_util, gpu.temp_c, gpu.power_w, gpu.sm_clock_mhz) == (None, None, None, None)


def test_mig_instance_series_are_not_taken_for_the_gpu():
    text = (_series("DCGM_FI_DEV_FB_USED", "50") + _series("DCGM_FI_DEV_FB_FREE", "81000")
            + _series("DCGM_FI_DEV_FB_USED", "19000", extra=',GPU_I_PROFILE="1g.10gb",GPU_I_ID="9"'))

    (gpu,) = parse_dcgm_metrics(text, collected_at=1.0).gpus

    assert gpu.fb_used_mib == 50


@pytest.mark.parametrize(("text", "message"), [
    (_series("DCGM_FI_DEV_GPU_UTIL", "130"),
     'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a100"}: expected a number 0..100 or null, got 130'),
    (_series("DCGM_FI_DEV_POWER_USAGE", "-4"), 'DCGM_FI_DEV_POWER_USAGE{UUID="GPU-a100"}: expected a power 0..10000 W'),
    (_series("DCGM_FI_DEV_FB_USED", "900") + _series("DCGM_FI_DEV_FB_FREE", "-1000"),
     'DCGM_FI_DEV_FB_FREE{UUID="GPU-a100"}: expected a number of MiB or null, got -1000'),
    ('DCGM_FI_DEV_GPU_UTIL{gpu="0",modelName="NVIDIA L40S"} 5\n',
     'DCGM_FI_DEV_GPU_UTIL{UUID=""}: label UUID: expected a non-empty string of at most 80 characters, got None'),
    (_series("DCGM_FI_DEV_GPU_UTIL", "5").replace('gpu="0"', 'gpu="zero"'),
     "label gpu: expected a GPU index, got 'zero'"),
    ("DCGM_FI_DEV_GPU_UTIL{gpu=0} 5\n", "invalid Prometheus text: "),
    ("<html>502 Bad Gateway</html>", "invalid Prometheus text: "),
    (b"\xff\xfe", "invalid metrics text: not UTF-8"),
])
def test_bad_scrapes_are_refused_with_the_series(text, message):
    with pytest.raises(PayloadError) as refused:
        parse_dcgm_metrics(text, collected_at=1.0)
    assert message in str(refused.value)
