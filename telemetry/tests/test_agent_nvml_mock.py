"""The agent's health fields through the real NVML C ABI: `python -m telemetry.agent --backend nvml`
over NVIDIA's mock libnvidia-ml.so.1 (fixtures/nvml-mock/README.md), read over HTTP on loopback.

The mock serves eight L40S GPUs from a YAML file; this test writes its own, with GPU 2 given
uncorrectable ECC errors and HW thermal slowdown at 94 °C (an override replaces the
whole `thermal` section, so it repeats the thresholds). The mock applies remapped rows to every GPU at
once (its README), so the pending remap shows on all eight.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from telemetry.agent.health import GPU_HEALTH_FIELDS

REPO = Path(__file__).resolve().parents[2]
MOCK = Path(__file__).parent / "fixtures" / "nvml-mock"
TOKEN = "mock-token-7"
FAULTY = 2
FAULTY_OVERRIDES = """\
    ecc:
      errors:
        volatile:
          double_bit:
            device_memory: 3
            total: 3
        aggregate:
          double_bit:
            device_memory: 5
            total: 5
    clocks_throttle_reasons:
      gpu_idle: false
      hw_slowdown: true
      hw_thermal_slowdown: true
    thermal:
      temperature_gpu_c: 94
      temperature_memory_c: 88
      shutdown_threshold_c: 96
      slowdown_threshold_c: 93
      max_operating_c: 89
      target_temperature_c: 83
"""


def _config(tmp_path: Path) -> Path:
    text = (MOCK / "l40s.yaml").read_text(encoding="utf-8")
    text = text.replace(
        "  remapped_rows:\n    correctable: 0\n    uncorrectable: 0\n    pending: false\n",
        "  remapped_rows:\n    correctable: 0\n    uncorrectable: 1\n    pending: true\n",
    )
    assert "uncorrectable: 1" in text, "the shipped L40S config changed shape"
    device_end = text.index("    minor_number: 2\n") + len("    minor_number: 2\n")
    text = text[:device_end] + FAULTY_OVERRIDES + text[device_end:]
    path = tmp_path / "l40s-faulty.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def mock_agent(tmp_path):
    """(document of one GET /v1/metrics) from an agent process on the mock library."""
    token = tmp_path / "token"
    token.write_text(TOKEN, encoding="utf-8")
    token.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "DJANGO_SETTINGS_MODULE"}}
    env["LD_LIBRARY_PATH"] = str(MOCK)
    env["MOCK_NVML_CONFIG"] = str(_config(tmp_path))
    process = subprocess.Popen(
        [sys.executable, "-m", "telemetry.agent", "--listen", "127.0.0.1:0", "--token-file", str(token),
         "--backend", "nvml", "--hostname", "mock-l40s"],
        cwd=REPO, env=env, stderr=subprocess.PIPE, text=True,
    )
    try:
        banner = ""
        while "serving" not in banner:
            banner = process.stderr.readline()
            assert banner, "the agent exited before serving"
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)", banner).group(1))
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/v1/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        response = conn.getresponse()
        assert response.status == 200
        yield json.loads(response.read())
        conn.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stderr.close()


def test_injected_faults_show_on_their_gpu_and_healthy_values_on_the_others(mock_agent):
    gpus = mock_agent["gpus"]
    assert len(gpus) == 8
    faulty = gpus[FAULTY]["health"]
    assert faulty["ecc_uncorrected_volatile"] == 3
    assert faulty["ecc_uncorrected_aggregate"] == 5
    assert "hw_thermal_slowdown" in faulty["throttle_reasons"]
    assert "gpu_idle" not in faulty["throttle_reasons"]
    assert gpus[FAULTY]["temp_c"] == 94
    for index, gpu in enumerate(gpus):
        health = gpu["health"]
        assert list(health) == [*GPU_HEALTH_FIELDS, "unsupported"]
        assert (health["remapped_rows_uncorrectable"], health["remapped_rows_pending"]) == (1, True)
        assert health["temp_slowdown_c"] == 93.0
        assert health["temp_shutdown_c"] == 96.0
        assert health["power_limit_w"] == 350.0
        assert gpu["errors"] == {}
        if index != FAULTY:
            assert health["ecc_uncorrected_volatile"] == health["ecc_uncorrected_aggregate"] == 0
            assert health["throttle_reasons"] == ["gpu_idle"]
            assert health["ecc_mode"] == "enabled"


def test_unsupported_fields_are_null_and_listed(mock_agent):
    for gpu in mock_agent["gpus"]:
        health = gpu["health"]
        # A passively cooled L40S has no fan: the mock, like the driver, answers NOT_SUPPORTED.
        assert health["fan_speed_pct"] is None
        assert "fan_speed_pct" in health["unsupported"]
        assert all(health[field] is None for field in health["unsupported"])
    assert mock_agent["driver"] == {
        "driver_version": "550.163.01",
        "vgpu_manager_version": None,
        "nvml_version": "12.550.163.01",
        "cuda_driver_version": 12040,
        "unsupported": ["vgpu_manager_version"],
        "errors": {},
    }
