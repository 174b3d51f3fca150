"""`nvidia-smi -q -x` documents: every real capture parses with the values it holds, XML attacks
and malformed documents are refused."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from telemetry.payload import PayloadError, VgpuReading
from telemetry.sources.nvidia_smi import document_time, parse_nvidia_smi
from telemetry.tests.ingest_world import OWN_FIXTURES, SHARED_CAPTURES, SYNTHETIC_CAPTURES

# Read off each capture by hand: identity, frame buffer, utilization, temperature, power, SM clock.
CAPTURES = {
    "tesla-t4.xml": dict(
        uuid="GPU-d37e67a5-91dd-3774-a5cb-99096249601a", name="Tesla T4", pci_bus_id="00000000:00:1E.0",
        fb_total_mib=15360, fb_used_mib=1032, util=(0, 0, 0, 0), temp_c=40, power_w=26.78, sm_clock_mhz=585,
        mode="passthrough", stamp="2023-04-24T16:22:39"),
    "a100-sxm4-v12.xml": dict(
        # MIG mode: the instances repeat fb_memory_usage (12 MiB used of 19968); the GPU's own is 50 of 81920,
        # and per-GPU utilization is N/A.
        uuid="GPU-513536b6-7d19-9063-b049-1e69664bb298", name="NVIDIA A100-SXM4-80GB", pci_bus_id="00000000:01:00.0",
        fb_total_mib=81920, fb_used_mib=50, util=(None, None, None, None), temp_c=27, power_w=67.03,
        sm_clock_mhz=1275, mode="none", stamp="2023-08-04T11:44:30"),
    "quadro-p2000-v12.xml": dict(
        uuid="GPU-396caaed-39ca-3199-2e68-717cdb786ec6", name="Quadro P2000", pci_bus_id="00000000:17:00.0",
        fb_total_mib=5120, fb_used_mib=1, util=(0, 0, 0, 0), temp_c=34, power_w=4.61, sm_clock_mhz=139,
        mode="none", stamp="2023-09-20T09:37:38"),
    "rtx-3090-v12.xml": dict(
        uuid="GPU-12345678-aaaa-bbbb-cccc-0123456789ab", name="NVIDIA GeForce RTX 3090", pci_bus_id="00000000:00:10.0",
        fb_total_mib=24576, fb_used_mib=1, util=(0, 0, 0, 0), temp_c=37, power_w=27.23, sm_clock_mhz=0,
        mode="passthrough", stamp="2024-05-03T11:54:37"),
    "rtx-3080-v13.xml": dict(
        # v13 prints average_power_draw (139.62 W) and instant_power_draw (142.33 W): the average is NVML's figure.
        uuid="GPU-19d6d965-2acc-f646-00f8-4c76979aabb4", name="NVIDIA GeForce RTX 3080", pci_bus_id="00000000:0C:00.0",
        fb_total_mib=10240, fb_used_mib=9184, util=(65, 9, 0, 0), temp_c=27, power_w=139.62, sm_clock_mhz=1950,
        mode="none", stamp="2026-04-10T10:23:01"),
    "h200-v13.xml": dict(
        uuid="GPU-8f9caa6d-a69d-7318-7329-fa0dcff3636d", name="NVIDIA H200", pci_bus_id="00000000:00:06.0",
        fb_total_mib=143771, fb_used_mib=0, util=(0, 0, 0, 0), temp_c=44, power_w=84.58, sm_clock_mhz=780,
        mode="passthrough", stamp="2026-11-22T01:57:49"),
}


def test_every_real_capture_has_its_expected_values_here():
    real = {p.name for p in SHARED_CAPTURES.glob("*.xml")} - SYNTHETIC_CAPTURES
    assert sorted(real) == sorted(CAPTURES)


@pytest.mark.parametrize("filename", sorted(CAPTURES))
def test_real_capture_parses_with_the_values_it_holds(filename):
    expected = CAPTURES[filename]

    report = parse_nvidia_smi((SHARED_CAPTURES / filename).read_bytes(), hostname="render-01")

    assert report.hostname == "render-01"
    assert report.backend == "nvidia-smi"
    assert report.guest_vgpus == []
    (gpu,) = report.gpus
    assert (gpu.uuid, gpu.name, gpu.pci_bus_id, gpu.index) == (
        expected["uuid"], expected["name"], expected["pci_bus_id"], 0)
    assert (gpu.fb_total_mib, gpu.fb_used_mib) == (expected["fb_total_mib"], expected["fb_used_mib"])
    assert (gpu.util_gpu, gpu.util_mem, gpu.enc_util, gpu.dec_util) == expected["util"]
    assert (gpu.temp_c, gpu.power_w, gpu.sm_clock_mhz) == (expected["temp_c"], expected["power_w"],
                                                           expected["sm_clock_mhz"])
    assert gpu.virtualization_mode == expected["mode"]
    assert gpu.vgpus == []
    # Without the arrival time, the zoneless stamp is read as UTC.
    assert report.collected_at == datetime.fromisoformat(expected["stamp"]).replace(tzinfo=UTC).timestamp()


def test_a_capture_read_as_text_gives_the_same_report():
    raw = (SHARED_CAPTURES / "a100-sxm4-v12.xml").read_bytes()
    assert parse_nvidia_smi(raw.decode()) == parse_nvidia_smi(raw)


def test_vgpu_host_capture_lists_its_vgpus():
    report = parse_nvidia_smi((OWN_FIXTURES / "nvidia-smi" / "l40s-vgpu-host-v13.xml").read_bytes(), "render-01")

    (gpu,) = report.gpus
    assert (gpu.name, gpu.virtualization_mode, gpu.fb_total_mib, gpu.fb_used_mib) == (
        "NVIDIA L40S", "vgpu_host", 46068, 14336)
    assert gpu.vgpus == [
        VgpuReading(vgpu_uuid="a3c1e2f4-5b6d-4e7f-8a9b-0c1d2e3f4a5b", vm_uuid="6f1d5e8a-2b7c-4c1d-9e3f-0a1b2c3d4e5f",
                    vm_name="ws-lighting-01", type_name="NVIDIA L40S-12Q", fb_used_mib=9011, util_gpu=30,
                    util_mem=15, enc_util=4, dec_util=0),
        # An ESXi/Xen domain id is no VM UUID: the VM is then found by name.
        VgpuReading(vgpu_uuid="b4d2f3a5-6c7e-4f80-9bac-1d2e3f4a5b6c", vm_uuid=None, vm_name="ws-layout-02",
                    type_name="NVIDIA L40S-4Q", fb_used_mib=2100, util_gpu=8, util_mem=6, enc_util=None,
                    dec_util=None),
        VgpuReading(vgpu_uuid="c5e3a4b6-7d8f-4a91-8cbd-2e3f4a5b6c7d", vm_uuid="7e2f6a9b-3c8d-4d2e-8f40-1b2c3d4e5f60",
                    vm_name="ws-stray-99", type_name="NVIDIA L40S-2Q", fb_used_mib=512, util_gpu=0, util_mem=0,
                    enc_util=0, dec_util=0),
    ]


def test_guest_capture_is_a_vgpu_of_the_vm_not_a_gpu():
    report = parse_nvidia_smi((OWN_FIXTURES / "nvidia-smi" / "l40s-2q-guest-v13.xml").read_bytes(), "ws-lighting-01")

    assert report.gpus == []
    assert report.guest_vgpus == [VgpuReading(
        vgpu_uuid="GPU-5d8e2b1c-9a4f-11f0-8de9-0242ac120002", vm_uuid=None, vm_name="ws-lighting-01",
        type_name="L40S-2Q", fb_used_mib=612, util_gpu=23, util_mem=11, enc_util=2, dec_util=0)]


def test_grid_prefixed_guest_name_is_recognised_too():
    raw = (OWN_FIXTURES / "nvidia-smi" / "l40s-2q-guest-v13.xml").read_text()
    raw = raw.replace("<product_name>NVIDIA L40S-2Q</product_name>", "<product_name>GRID T4-4Q</product_name>")
    raw = raw.replace("<virtualization_mode>VGPU</virtualization_mode>",
                      "<virtualization_mode>N/A</virtualization_mode>")

    report = parse_nvidia_smi(raw, "ws-old")

    assert report.gpus == []
    assert report.guest_vgpus[0].type_name == "T4-4Q"


def test_zoneless_stamp_takes_the_offset_nearest_to_arrival():
    stamp = "Fri Aug  4 11:44:30 2023"
    as_utc = datetime(2023, 8, 4, 11, 44, 30, tzinfo=UTC).timestamp()
    # The host runs on UTC+2 (so 09:44:30 UTC), the document arrives 3 s later.
    assert document_time(stamp, received_at=as_utc - 7200 + 3) == as_utc - 7200
    # India, UTC+5:30; then a host 40 s fast on UTC: that skew stays for the ingest to judge.
    assert document_time(stamp, received_at=as_utc - 19800 + 1) == as_utc - 19800
    assert document_time(stamp, received_at=as_utc - 40) == as_utc
    # The same document re-sent a minute later keeps its instant, so it is stored once.
    assert document_time(stamp, received_at=as_utc + 2) == document_time(stamp, received_at=as_utc + 62)


@pytest.mark.parametrize(("document", "message"), [
    (b"<nvidia_smi_log><timestamp>Mon Apr 24 16:22:39 2023</timestamp><gpu id='1'>", "malformed XML: "),
    (b"not xml at all", "malformed XML: syntax error: line 1, column 0"),
    (b"", "malformed XML: no element found"),
    (b"<nvidia_smi_log>", "malformed XML: no element found"),
    (b"<html><body>502 Bad Gateway</body></html>",
     "not an nvidia-smi -q -x document: the root element is <html>, expected <nvidia_smi_log>"),
    (b"<nvidia_smi_log><timestamp>yesterday</timestamp></nvidia_smi_log>",
     "timestamp: expected a date like 'Fri Aug  4 11:44:30 2023', got 'yesterday'"),
    (b"<nvidia_smi_log></nvidia_smi_log>", "timestamp: expected a date like"),
])
def test_malformed_documents_are_refused(document, message):
    with pytest.raises(PayloadError) as refused:
        parse_nvidia_smi(document)
    assert str(refused.value).startswith(message)


BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE nvidia_smi_log [
  <!ENTITY lol "lol">
  <!ENTITY lol1 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
  <!ENTITY lol2 "&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;">
  <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
  <!ENTITY lol9 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
]>
<nvidia_smi_log><timestamp>&lol9;</timestamp></nvidia_smi_log>"""

EXTERNAL_ENTITY = b"""<?xml version="1.0"?>
<!DOCTYPE nvidia_smi_log [<!ENTITY secret SYSTEM "file:///etc/passwd">]>
<nvidia_smi_log><timestamp>Mon Apr 24 16:22:39 2023</timestamp>
<gpu id="x"><uuid>&secret;</uuid></gpu></nvidia_smi_log>"""


@pytest.mark.parametrize("document", [BILLION_LAUGHS, EXTERNAL_ENTITY], ids=["billion-laughs", "external-entity"])
def test_xml_bombs_and_external_entities_are_refused_unexpanded(document):
    with pytest.raises(PayloadError) as refused:
        parse_nvidia_smi(document)
    assert str(refused.value).startswith("refused XML: ")
    assert "nvidia-smi documents declare no entities" in str(refused.value)
    assert "root:" not in str(refused.value)


def _t4(old: str, new: str) -> bytes:
    raw = (SHARED_CAPTURES / "tesla-t4.xml").read_text()
    assert old in raw
    return raw.replace(old, new, 1).encode()


@pytest.mark.parametrize(("document", "message"), [
    (_t4("<gpu_util>0 %</gpu_util>", "<gpu_util>abc</gpu_util>"),
     "gpu[0]/utilization/gpu_util: expected a value like '12 %', got 'abc'"),
    (_t4("<gpu_util>0 %</gpu_util>", "<gpu_util>250 %</gpu_util>"),
     "gpu[0]/utilization/gpu_util: expected a number 0..100 or null, got 250.0"),
    (_t4("<used>1032 MiB</used>", "<used>1032 W</used>"),
     "gpu[0]/fb_memory_usage/used: expected a value like '12 MiB' or '12 GiB' or '12 KiB', got '1032 W'"),
    (_t4("<used>1032 MiB</used>", "<used>20000 MiB</used>"),
     "gpu[0]/fb_memory_usage/used: expected a number of MiB 0..15360 or null, got 20000.0"),
    (_t4("<uuid>GPU-d37e67a5-91dd-3774-a5cb-99096249601a</uuid>", "<uuid>N/A</uuid>"),
     "gpu[0]/uuid: expected a non-empty string of at most 80 characters, got None"),
    (_t4("<power_draw>26.78 W</power_draw>", "<power_draw>-5 W</power_draw>"),
     "gpu[0]/power_draw: expected a power 0..10000 W or null, got -5.0"),
])
def test_bad_values_are_refused_with_their_path(document, message):
    with pytest.raises(PayloadError) as refused:
        parse_nvidia_smi(document)
    assert str(refused.value) == message


@pytest.mark.parametrize("state", ["N/A", "[N/A]", "[Not Supported]", "Not Supported", "[Unknown Error]"])
def test_unavailable_values_are_null_not_zero(state):
    report = parse_nvidia_smi(_t4("<gpu_temp>40 C</gpu_temp>", f"<gpu_temp>{state}</gpu_temp>"))
    assert report.gpus[0].temp_c is None
    assert report.gpus[0].util_gpu == 0


def test_a_gpu_listed_twice_is_refused():
    raw = (SHARED_CAPTURES / "tesla-t4.xml").read_text()
    start, end = raw.index("<gpu id="), raw.index("</gpu>") + len("</gpu>")
    doubled = raw[:end] + raw[start:end] + raw[end:]
    with pytest.raises(PayloadError) as refused:
        parse_nvidia_smi(doubled)
    assert str(refused.value) == "gpu[1].uuid: 'GPU-d37e67a5-91dd-3774-a5cb-99096249601a' is already gpu[0]"
