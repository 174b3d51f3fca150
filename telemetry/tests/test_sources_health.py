"""Health from the sources that are not the agent: every real nvidia-smi capture maps its health
fields (N/A is null and unsupported, never 0), vGPU licences and guests, the driver; dcgm-exporter
maps its health counters, the last-XID gauge and the driver label, and utilization from the
profiling counter where the exporter has no DCGM_FI_DEV_GPU_UTIL."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from telemetry.payload import PayloadError
from telemetry.sources.dcgm import parse_dcgm_metrics
from telemetry.sources.nvidia_smi import parse_nvidia_smi
from telemetry.tests.ingest_world import OWN_FIXTURES, SHARED_CAPTURES

NO_RETIRED = ["retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending"]
NO_REMAP = ["remapped_rows_correctable", "remapped_rows_uncorrectable", "remapped_rows_pending",
            "remapped_rows_failure"]
NO_ECC = ["ecc_mode", "ecc_corrected_volatile", "ecc_uncorrected_volatile", "ecc_corrected_aggregate",
          "ecc_uncorrected_aggregate"]

# Read off each capture by hand: driver, CUDA, ECC mode and counts (corrected, uncorrected, volatile then
# aggregate), retired pages (sbe, dbe, pending), remapped rows (corr, unc, pending, failure), throttle flags
# and bitmask, PCIe replays, fan, slowdown and shutdown temperatures, power limit, P-state, unsupported.
CAPTURES = {
    "tesla-t4.xml": dict(
        driver=("515.105.01", 11070), ecc=("enabled", 0, 0, 0, 0), retired=(0, 0, False),
        remapped=(None, None, None, None), throttles=([], 0), replay=0, fan=None, temps=(93, 96), power=70,
        pstate="P0", unsupported=["fan_speed_pct", *NO_REMAP]),
    "a100-sxm4-v12.xml": dict(
        driver=("535.54.03", 12020), ecc=("enabled", 0, 0, 0, 0), retired=(None, None, None),
        remapped=(None, None, None, None), throttles=([], 0), replay=0, fan=None, temps=(89, 92), power=500,
        pstate="P0", unsupported=[*NO_RETIRED, "fan_speed_pct", *NO_REMAP]),
    "quadro-p2000-v12.xml": dict(
        driver=("525.125.06", 12000), ecc=(None, None, None, None, None), retired=(None, None, None),
        remapped=(None, None, None, None), throttles=(["gpu_idle"], 1), replay=0, fan=46, temps=(101, 104),
        power=75, pstate="P8", unsupported=[*NO_ECC, *NO_RETIRED, *NO_REMAP]),
    "rtx-3090-v12.xml": dict(
        driver=("525.147.05", 12000), ecc=(None, None, None, None, None), retired=(None, None, None),
        remapped=(None, None, None, None), throttles=(["gpu_idle"], 1), replay=0, fan=0, temps=(95, 98),
        power=200, pstate="P8", unsupported=[*NO_ECC, *NO_RETIRED, *NO_REMAP]),
    "rtx-3080-v13.xml": dict(
        driver=("595.58.03", 13020), ecc=(None, None, None, None, None), retired=(None, None, None),
        remapped=(None, None, None, None), throttles=([], 0), replay=0, fan=0, temps=(95, 98), power=320,
        pstate="P2", unsupported=[*NO_ECC, *NO_RETIRED, *NO_REMAP]),
    # Hopper, v13: thresholds only as offsets from T.Limit (not stored), no fan, rows remapped not retired.
    "h200-v13.xml": dict(
        driver=("580.159.04", 13000), ecc=("enabled", 0, 0, 0, 0), retired=(None, None, None),
        remapped=(0, 0, False, False), throttles=(["gpu_idle"], 1), replay=0, fan=None, temps=(None, None),
        power=700, pstate="P0", unsupported=[*NO_RETIRED, "fan_speed_pct"]),
}


@pytest.mark.parametrize("filename", sorted(CAPTURES))
def test_every_real_capture_maps_its_health(filename):
    expected = CAPTURES[filename]

    report = parse_nvidia_smi((SHARED_CAPTURES / filename).read_bytes(), hostname="render-01")

    assert (report.driver.driver_version, report.driver.cuda_driver_version) == expected["driver"]
    (gpu,) = report.gpus
    health = gpu.health
    assert (health.ecc_mode, health.ecc_corrected_volatile, health.ecc_uncorrected_volatile,
            health.ecc_corrected_aggregate, health.ecc_uncorrected_aggregate) == expected["ecc"]
    assert (health.retired_pages_sbe, health.retired_pages_dbe, health.retired_pages_pending) == expected["retired"]
    assert (health.remapped_rows_correctable, health.remapped_rows_uncorrectable, health.remapped_rows_pending,
            health.remapped_rows_failure) == expected["remapped"]
    assert (health.throttle_reasons, gpu.clocks_event_reasons) == expected["throttles"]
    assert (health.pcie_replay_counter, health.fan_speed_pct) == (expected["replay"], expected["fan"])
    assert (health.temp_slowdown_c, health.temp_shutdown_c) == expected["temps"]
    assert (health.power_limit_w, health.performance_state) == (expected["power"], expected["pstate"])
    assert sorted(health.unsupported) == sorted(expected["unsupported"])
    assert health.xid_events == []  # nvidia-smi shows none


def _h200(old: str, new: str) -> bytes:
    raw = (SHARED_CAPTURES / "h200-v13.xml").read_text()
    assert old in raw
    return raw.replace(old, new, 1).encode()


def test_sram_and_dram_counts_are_summed_into_one_figure():
    # v13 splits uncorrectable SRAM errors into parity and SEC-DED: all three and DRAM's add up.
    document = _h200("<sram_correctable>0</sram_correctable>\n\t\t\t\t<sram_uncorrectable_parity>0"
                     "</sram_uncorrectable_parity>\n\t\t\t\t<sram_uncorrectable_secded>0</sram_uncorrectable_secded>"
                     "\n\t\t\t\t<dram_correctable>0</dram_correctable>\n\t\t\t\t<dram_uncorrectable>0"
                     "</dram_uncorrectable>",
                     "<sram_correctable>5</sram_correctable><sram_uncorrectable_parity>1</sram_uncorrectable_parity>"
                     "<sram_uncorrectable_secded>2</sram_uncorrectable_secded><dram_correctable>7</dram_correctable>"
                     "<dram_uncorrectable>4</dram_uncorrectable>")

    health = parse_nvidia_smi(document).gpus[0].health

    assert (health.ecc_corrected_volatile, health.ecc_uncorrected_volatile) == (12, 7)
    assert (health.ecc_corrected_aggregate, health.ecc_uncorrected_aggregate) == (0, 0)


def test_active_throttle_flags_make_the_nvml_bitmask():
    document = _h200("<clocks_event_reason_sw_power_cap>Not Active</clocks_event_reason_sw_power_cap>",
                     "<clocks_event_reason_sw_power_cap>Active</clocks_event_reason_sw_power_cap>")
    document = document.replace(b"<clocks_event_reason_display_clocks_setting>Not Active",
                                b"<clocks_event_reason_display_clocks_setting>Active")

    gpu = parse_nvidia_smi(document).gpus[0]

    assert gpu.health.throttle_reasons == ["gpu_idle", "sw_power_cap", "display_clock_setting"]
    assert gpu.clocks_event_reasons == 0x1 | 0x4 | 0x100


def test_pending_remap_and_retirement_are_read_as_yes_or_no():
    health = parse_nvidia_smi(_h200("<remapped_row_pending>No</remapped_row_pending>",
                                    "<remapped_row_pending>Yes</remapped_row_pending>")).gpus[0].health
    assert health.remapped_rows_pending is True

    older = (SHARED_CAPTURES / "tesla-t4.xml").read_text().replace(
        "<pending_retirement>No</pending_retirement>", "<pending_retirement>Yes</pending_retirement>")
    assert parse_nvidia_smi(older).gpus[0].health.retired_pages_pending is True


def test_vgpu_instances_carry_licence_guest_driver_frame_rate_and_encoder_sessions():
    capture = (OWN_FIXTURES / "nvidia-smi" / "l40s-vgpu-host-v13.xml").read_text()

    lighting = parse_nvidia_smi(capture).gpus[0].vgpus[0]

    health = lighting.health
    assert (health.license_state, health.license_expiry) == (
        "licensed", datetime(2026, 12, 1, 9, 15, 2, tzinfo=UTC).timestamp())
    assert (health.guest_driver_version, health.frame_rate_limit, health.encoder_sessions) == ("550.90.07", 60, 1)
    assert (health.guest_info_state, health.unsupported) == (None, [])

    unlicensed = parse_nvidia_smi(capture.replace("Licensed (Expiry: 2026-12-1 9:15:2 GMT)",
                                                  "Unlicensed (Restricted)", 1)).gpus[0].vgpus[0].health
    assert (unlicensed.license_state, unlicensed.license_expiry) == ("unlicensed", None)
    unknown = parse_nvidia_smi(capture.replace("<frame_rate_limit>60 FPS</frame_rate_limit>",
                                               "<frame_rate_limit>N/A</frame_rate_limit>", 1)).gpus[0].vgpus[0].health
    assert (unknown.frame_rate_limit, unknown.unsupported) == (None, ["frame_rate_limit"])


def test_a_guests_document_names_no_host_driver():
    guest = parse_nvidia_smi((OWN_FIXTURES / "nvidia-smi" / "l40s-2q-guest-v13.xml").read_bytes(), "ws-01")
    assert (guest.driver, guest.gpus) == (None, [])


@pytest.mark.parametrize(("old", "new", "message"), [
    ("<fan_speed>N/A</fan_speed>", "<fan_speed>fast</fan_speed>",
     "gpu[0]/fan_speed: expected a fan speed like '46 %', got 'fast'"),
    ("<remapped_row_corr>0</remapped_row_corr>", "<remapped_row_corr>-1</remapped_row_corr>",
     "gpu[0]/remapped_rows/remapped_row_corr: expected an integer count 0..4611686018427387904, got '-1'"),
    ("<remapped_row_failure>No</remapped_row_failure>", "<remapped_row_failure>Maybe</remapped_row_failure>",
     "gpu[0]/remapped_rows/remapped_row_failure: expected one of yes, no, got 'Maybe'"),
    ("<current_ecc>Enabled</current_ecc>", "<current_ecc>Sometimes</current_ecc>",
     "gpu[0]/ecc_mode/current_ecc: expected one of enabled, disabled, got 'Sometimes'"),
    ("<dram_correctable>0</dram_correctable>", "<dram_correctable>many</dram_correctable>",
     "gpu[0]/ecc_errors/volatile/dram_correctable: expected an integer count, got 'many'"),
    ("<performance_state>P0</performance_state>", "<performance_state>turbo</performance_state>",
     "gpu[0]/performance_state: expected P0..P15, got 'turbo'"),
    ("<current_power_limit>700.00 W</current_power_limit>", "<current_power_limit>700 V</current_power_limit>",
     "gpu[0]/gpu_power_readings/current_power_limit: expected a power 0..10000 W, got '700 V'"),
    ("<cuda_version>13.0</cuda_version>", "<cuda_version>thirteen</cuda_version>",
     "cuda_version: expected a version like 12.2, got 'thirteen'"),
])
def test_bad_health_values_are_refused_with_their_path(old, new, message):
    with pytest.raises(PayloadError) as refused:
        parse_nvidia_smi(_h200(old, new))
    assert str(refused.value) == message


def test_a_bad_licence_status_is_refused_with_its_path():
    capture = (OWN_FIXTURES / "nvidia-smi" / "l40s-vgpu-host-v13.xml").read_text()
    with pytest.raises(PayloadError) as refused:
        parse_nvidia_smi(capture.replace("Licensed (Expiry: 2026-12-1 9:15:2 GMT)", "Borrowed", 1))
    assert str(refused.value) == ("gpu[0]/vgpus/vgpu_instance[0]/license_status: expected 'Licensed (Expiry: ...)' "
                                  "or 'Unlicensed (...)', got 'Borrowed'")


# -- dcgm-exporter ----------------------------------------------------------------------------------

A100 = OWN_FIXTURES / "dcgm-exporter" / "a100-prof-health.prom"


def test_a100_scrape_without_gpu_util_takes_the_graphics_engine_ratio():
    report = parse_dcgm_metrics(A100.read_text(), collected_at=1_780_000_000.0)

    busy, idle = report.gpus
    assert busy.util_gpu == pytest.approx(87.4512)
    assert idle.util_gpu == 0.0
    assert (report.driver.driver_version, report.driver.cuda_driver_version) == ("535.183.01", None)


def test_a100_scrape_maps_the_health_counters():
    busy, idle = parse_dcgm_metrics(A100.read_text(), collected_at=1_780_000_000.5).gpus

    health = busy.health
    assert (health.ecc_corrected_volatile, health.ecc_uncorrected_volatile, health.ecc_corrected_aggregate,
            health.ecc_uncorrected_aggregate) == (12, 1, 40, 2)
    assert (health.remapped_rows_correctable, health.remapped_rows_uncorrectable, health.remapped_rows_pending,
            health.remapped_rows_failure) == (4, 1, True, False)
    assert (busy.clocks_event_reasons, health.throttle_reasons) == (68, ["sw_power_cap", "hw_thermal_slowdown"])
    assert (health.pcie_replay_counter, health.power_limit_w) == (3, 400)
    assert health.fan_speed_pct is None  # not exported: not told
    assert health.unsupported == []
    (xid,) = health.xid_events
    assert (xid.code, xid.at, xid.last_seen) == (79, 1_780_000_000.5, True)
    assert idle.health.xid_events == []  # 0: no XID since the driver loaded
    assert idle.health.throttle_reasons == ["gpu_idle"]


def test_a_scrape_without_health_fields_has_no_health():
    (gpu, *_) = parse_dcgm_metrics((OWN_FIXTURES / "dcgm-exporter" / "render-07-l40s.prom").read_text(),
                                   collected_at=1.0).gpus
    # render-07's scrape carries the replay counter and the XID gauge (0) of the default counters.
    assert (gpu.health.pcie_replay_counter, gpu.health.xid_events, gpu.clocks_event_reasons) == (0, [], None)
    bare = parse_dcgm_metrics('DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-x"} 5\n', collected_at=1.0)
    assert (bare.gpus[0].health, bare.driver) == (None, None)


def test_a_guests_exporter_gives_its_vgpus_licence():
    text = ('DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a0acdf3c",modelName="NVIDIA H100-20C",'
            'DCGM_FI_DRIVER_VERSION="580.95.05"} 3\n'
            'DCGM_FI_DEV_VGPU_LICENSE_STATUS{gpu="0",UUID="GPU-a0acdf3c",modelName="NVIDIA H100-20C"} 0\n')

    report = parse_dcgm_metrics(text, hostname="ws-07", collected_at=1.0)

    (vgpu,) = report.guest_vgpus
    assert vgpu.health.license_state == "unlicensed"
    assert report.driver is None  # the VM's driver, not a host's


@pytest.mark.parametrize(("series", "message"), [
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE 1.5", "expected a ratio 0..1"),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL -1", "expected an integer count >= 0"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE 2", "expected 0 or 1"),
    ("DCGM_FI_DEV_XID_ERRORS 7.5", "expected an integer count >= 0"),
    ("DCGM_FI_DEV_PSTATE 20", "expected a performance state 0..15"),
])
def test_bad_health_series_are_refused_with_the_series(series, message):
    name, value = series.split()
    with pytest.raises(PayloadError) as refused:
        parse_dcgm_metrics(f'{name}{{gpu="0",UUID="GPU-a100"}} {value}\n', collected_at=1.0)
    assert str(refused.value).startswith(f'{name}{{UUID="GPU-a100"}}: {message}')
