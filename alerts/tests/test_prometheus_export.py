"""`manage.py export_alert_rules`: the file passes `promtool check rules`, and promtool's own rule
unit tests (series in, alerts out) show that each exported rule fires on the series the
dashboard's /metrics writes, with the thresholds set in the dashboard."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml
from django.core.management import CommandError, call_command

from alerts import services
from alerts.evaluate import ensure_rules

pytestmark = pytest.mark.django_db

GPU = 'host="node-01", gpu_uuid="GPU-1", pci_bus_id="00000000:3B:00.0", gpu_model="L40S"'
GPU2 = 'host="node-01", gpu_uuid="GPU-2", pci_bus_id="00000000:5E:00.0", gpu_model="L40S"'
VGPU = 'host="node-01", gpu_uuid="GPU-1", vm="vws-anim-01", artist="Ana", profile="L40S-12Q"'


def as_yaml(labels: str) -> str:
    """`a="b", c="d"` (series syntax) as `a: "b", c: "d"` (the expected labels' YAML)."""
    return labels.replace('="', ': "')


def export(tmp_path) -> str:
    path = tmp_path / "vgpu-fleet.rules.yml"
    call_command("export_alert_rules", str(path))
    return str(path)


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, check=False)


def test_the_exported_file_passes_promtool_and_leaves_out_the_dashboard_only_rules(tmp_path):
    path = export(tmp_path)
    checked = promtool("check", "rules", path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    rules = yaml.safe_load(Path(path).read_text())["groups"][0]["rules"]
    slugs = {rule["labels"]["vgpu_fleet_rule"] for rule in rules}
    assert "licence_pool" not in slugs
    assert "scheduler_drift" not in slugs
    assert "# Judged by the dashboard only" in Path(path).read_text()


def test_a_disabled_rule_and_a_changed_threshold_are_exported_as_set(tmp_path):
    rules = ensure_rules()
    services.update_rule(rules["xid"], enabled=False)
    services.update_rule(rules["vgpu_fb_full"], params={"percent": 90, "minutes": 10})
    exported = yaml.safe_load(Path(export(tmp_path)).read_text())["groups"][0]["rules"]
    by_name = {rule["alert"]: rule for rule in exported}
    assert "VgpuFleetXid" not in by_name
    assert by_name["VgpuFleetVgpuFrameBufferFull"]["for"] == "600s"
    assert "* 0.9)" in by_name["VgpuFleetVgpuFrameBufferFull"]["expr"]


def test_promtool_unit_tests_fire_each_rule_on_the_dashboards_series(tmp_path):
    content = yaml.safe_load(Path(export(tmp_path)).read_text())
    for rule in content["groups"][0]["rules"]:
        rule.pop("annotations")  # the expressions and labels are under test; the texts are checked above
    rules_path = tmp_path / "bare.rules.yml"
    rules_path.write_text(yaml.safe_dump(content))
    tests = textwrap.dedent(f"""\
        rule_files: [{rules_path}]
        evaluation_interval: 1m
        tests:
          - interval: 1m
            input_series:
              - series: 'vgpu_fleet_gpu_temperature_celsius{{{GPU}}}'
                values: '86x10'
              - series: 'vgpu_fleet_gpu_slowdown_temperature_celsius{{{GPU}}}'
                values: '89x10'
              - series: 'vgpu_fleet_gpu_temperature_celsius{{{GPU2}}}'
                values: '70x10'
              - series: 'DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{{{GPU}}}'
                values: '65x10'
              - series: 'DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{{{GPU2}}}'
                values: '1x10'
              - series: 'vgpu_fleet_vgpu_fb_used_mib{{{VGPU}}}'
                values: '12000x10'
              - series: 'vgpu_fleet_vgpu_profile_fb_mib{{{VGPU}}}'
                values: '12288x10'
              - series: 'DCGM_FI_DEV_VGPU_LICENSE_STATUS{{{VGPU}}}'
                values: '1 1 0x8'
              - series: 'DCGM_FI_DEV_XID_ERRORS{{{GPU}}}'
                values: '0 0 79x8'
            alert_rule_test:
              - eval_time: 8m
                alertname: VgpuFleetGpuNearSlowdown
                exp_alerts:
                  - exp_labels: {{{as_yaml(GPU)}, severity: warning, vgpu_fleet_rule: gpu_temperature}}
              - eval_time: 8m
                alertname: VgpuFleetGpuThrottled
                exp_alerts:
                  - exp_labels: {{{as_yaml(GPU)}, severity: warning, vgpu_fleet_rule: throttling}}
              - eval_time: 8m
                alertname: VgpuFleetVgpuFrameBufferFull
                exp_alerts:
                  - exp_labels: {{{as_yaml(VGPU)}, severity: warning, vgpu_fleet_rule: vgpu_fb_full}}
              - eval_time: 8m
                alertname: VgpuFleetVgpuUnlicensed
                exp_alerts:
                  - exp_labels: {{{as_yaml(VGPU)}, severity: critical, vgpu_fleet_rule: vgpu_unlicensed}}
              - eval_time: 8m
                alertname: VgpuFleetXid
                exp_alerts:
                  - exp_labels: {{{as_yaml(GPU)}, severity: critical, vgpu_fleet_rule: xid}}
              - eval_time: 3m
                alertname: VgpuFleetGpuNearSlowdown
                exp_alerts: []
        """)
    test_file = tmp_path / "tests.yml"
    test_file.write_text(tests)
    result = promtool("test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_path_in_no_folder_is_refused_and_nothing_is_written(tmp_path):
    with pytest.raises(CommandError, match="is not a folder"):
        call_command("export_alert_rules", str(tmp_path / "missing" / "rules.yml"))
    assert not (tmp_path / "missing").exists()
