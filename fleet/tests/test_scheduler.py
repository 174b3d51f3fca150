"""The scheduler rules against vgpu-facts.md section 3: every policy combination's commands,
every validation message, the defaults and drift. Pure: no database."""

import pytest

from fleet import scheduler
from fleet.scheduler import SchedulerSettings as S

GPU = "00000000:86:00.0"

SMI = f"nvidia-smi vgpu -i {GPU} set-scheduler-state"
RUNTIME_NOTE = ("The nvidia-smi line needs no vGPU on the GPU and lasts until the driver reloads; the RmPVMRL line "
                "takes effect at the next driver reload or reboot.")

# Every combination of policy x ARR x (with ARR: frequency and averaging factor set or blank;
# without: time slice set or blank), with the exact nvidia-smi line (-ts in ns), the RmPVMRL value
# (vgpu-facts.md section 3: 0x00, 0x01, 0x03, 0x11, 0x13; a time slice in ms in bits 16-23 over
# 0x01 / 0x11 as in its examples 0x00030001 and 0x00180011), and whether the ARR parameters are
# flagged as lost at a driver reload (RmPVMRL has no encoding for them).
COMBINATIONS = [
    (S("best_effort"), f"{SMI} -p 1 -a 0", "0x00", False),
    (S("equal_share", arr=True), f"{SMI} -p 2 -a 1", "0x01", False),
    (S("equal_share", arr=True, frequency_hz=480), f"{SMI} -p 2 -a 1 -asf 480", "0x01", True),
    (S("equal_share", arr=True, avg_factor=33), f"{SMI} -p 2 -a 1 -aavg 33", "0x01", True),
    (S("equal_share", arr=True, frequency_hz=480, avg_factor=33), f"{SMI} -p 2 -a 1 -asf 480 -aavg 33", "0x01", True),
    (S("equal_share"), f"{SMI} -p 2 -a 0", "0x03", False),
    (S("equal_share", timeslice_ms=3), f"{SMI} -p 2 -a 0 -ts 3000000", "0x00030001", False),
    (S("equal_share", timeslice_ms=30), f"{SMI} -p 2 -a 0 -ts 30000000", "0x001E0001", False),
    (S("fixed_share", arr=True), f"{SMI} -p 3 -a 1", "0x11", False),
    (S("fixed_share", arr=True, frequency_hz=960), f"{SMI} -p 3 -a 1 -asf 960", "0x11", True),
    (S("fixed_share", arr=True, avg_factor=60), f"{SMI} -p 3 -a 1 -aavg 60", "0x11", True),
    (S("fixed_share", arr=True, frequency_hz=63, avg_factor=1), f"{SMI} -p 3 -a 1 -asf 63 -aavg 1", "0x11", True),
    (S("fixed_share"), f"{SMI} -p 3 -a 0", "0x13", False),
    (S("fixed_share", timeslice_ms=24), f"{SMI} -p 3 -a 0 -ts 24000000", "0x00180011", False),
    (S("fixed_share", timeslice_ms=1), f"{SMI} -p 3 -a 0 -ts 1000000", "0x00010011", False),
]


@pytest.mark.parametrize(("wanted", "runtime", "value", "arr_not_persistent"), COMBINATIONS)
def test_commands_of_every_combination_match_the_reference(wanted, runtime, value, arr_not_persistent):
    assert scheduler.validate(wanted) == []
    notes = [RUNTIME_NOTE] + ([scheduler.NOT_PERSISTENT_ARR] if arr_not_persistent else [])
    kvm = scheduler.commands(wanted, GPU, "kvm", pci_bus_id=GPU)
    assert kvm.runtime == runtime
    assert kvm.rmpvmrl == value
    assert kvm.persistent == [
        ("/etc/modprobe.d/nvidia.conf (all GPUs of the host)",
         f'options nvidia NVreg_RegistryDwords="RmPVMRL={value}"'),
        ("/etc/modprobe.d/nvidia.conf (this GPU only)",
         f'options nvidia NVreg_RegistryDwordsPerDevice="pci=0000:86:00.0;RmPVMRL={value}"'),
    ]
    assert kvm.notes == notes
    # Proxmox VE is Debian with KVM: the same modprobe.d lines.
    assert scheduler.commands(wanted, GPU, "proxmox", pci_bus_id=GPU).persistent == kvm.persistent
    esxi = scheduler.commands(wanted, GPU, "esxi", pci_bus_id=GPU)
    assert esxi.runtime == runtime
    assert esxi.persistent == [(
        "ESXi (all GPUs of the host)",
        f'esxcli system module parameters set -m nvidia -p "NVreg_RegistryDwords=RmPVMRL={value}"',
    )]
    assert esxi.notes == notes


def test_the_table_covers_every_combination():
    """policy x ARR x each optional parameter set or blank: a combination missing from the table
    would ship commands nobody checked against the reference."""
    def shape(s):
        return (s.policy, s.arr, s.frequency_hz is not None, s.avg_factor is not None, s.timeslice_ms is not None)

    covered = {shape(wanted) for wanted, *_ in COMBINATIONS}
    expected = {("best_effort", False, False, False, False)}
    for policy in ("equal_share", "fixed_share"):
        expected |= {(policy, True, freq, avg, False) for freq in (False, True) for avg in (False, True)}
        expected |= {(policy, False, False, False, ts) for ts in (False, True)}
    assert covered == expected


def test_kvm_without_a_pci_bus_id_gets_only_the_host_wide_line():
    kvm = scheduler.commands(S("equal_share", arr=True), 0, "kvm")
    assert kvm.runtime == "nvidia-smi vgpu -i 0 set-scheduler-state -p 2 -a 1"
    assert kvm.persistent == [("/etc/modprobe.d/nvidia.conf (all GPUs of the host)",
                               'options nvidia NVreg_RegistryDwords="RmPVMRL=0x01"')]


def test_reference_examples_of_rmpvmrl_values():
    assert scheduler.rmpvmrl_value(S("best_effort")) == 0x00
    assert scheduler.rmpvmrl_value(S("equal_share", arr=True)) == 0x01
    assert scheduler.rmpvmrl_value(S("equal_share")) == 0x03
    assert scheduler.rmpvmrl_value(S("fixed_share", arr=True)) == 0x11
    assert scheduler.rmpvmrl_value(S("fixed_share")) == 0x13
    assert scheduler.rmpvmrl_value(S("equal_share", timeslice_ms=3)) == 0x00030001
    assert scheduler.rmpvmrl_value(S("fixed_share", timeslice_ms=24)) == 0x00180011


def test_xenserver_uses_modprobe_and_hyperv_gets_only_the_runtime_line():
    xen = scheduler.commands(S("equal_share", arr=True), 0, "xenserver")
    assert xen.runtime == "nvidia-smi vgpu -i 0 set-scheduler-state -p 2 -a 1"
    assert xen.persistent == [("/etc/modprobe.d/nvidia.conf (all GPUs of the host)",
                               'options nvidia NVreg_RegistryDwords="RmPVMRL=0x01"')]
    hyperv = scheduler.commands(S("equal_share", arr=True), 0, "hyperv")
    assert hyperv.persistent == []
    assert "no persistent registry line for the hyperv hypervisor" in hyperv.notes[0]


def test_arr_parameters_are_flagged_as_not_persistent():
    notes = scheduler.commands(S("fixed_share", arr=True, frequency_hz=480), GPU, "kvm").notes
    assert scheduler.NOT_PERSISTENT_ARR in notes
    assert scheduler.NOT_PERSISTENT_ARR not in scheduler.commands(S("fixed_share", timeslice_ms=5), GPU, "kvm").notes


def messages(wanted, size_mode="equal"):
    return [(e.field, e.message) for e in scheduler.validate(wanted, size_mode)]


@pytest.mark.parametrize(("wanted", "size_mode", "expected"), [
    (S("round_robin"), "equal",
     [("policy", "Unknown policy 'round_robin'; choose best_effort, equal_share or fixed_share.")]),
    (S("fixed_share", arr=True), "mixed",
     [("policy", "Fixed share is impossible in mixed-size mode: it gives each vGPU 1/(its type's max count), "
                 "which needs vGPUs of one size. Use equal share, or switch the GPU to equal-size mode.")]),
    (S("best_effort", arr=True), "equal",
     [("arr", "Adaptive round-robin applies only to equal share and fixed share, not to best effort.")]),
    (S("best_effort", timeslice_ms=2), "equal",
     [("timeslice_ms", "A time slice applies only to equal share and fixed share, not to best effort.")]),
    (S("equal_share", frequency_hz=480), "equal",
     [("frequency_hz", "The scheduling frequency applies only with adaptive round-robin on.")]),
    (S("equal_share", avg_factor=33), "equal",
     [("avg_factor", "The averaging factor applies only with adaptive round-robin on.")]),
    (S("equal_share", arr=True, timeslice_ms=2), "equal",
     [("timeslice_ms", "A time slice applies only with adaptive round-robin off; with ARR the scheduling "
                       "frequency sets the slice.")]),
    (S("equal_share", arr=True, frequency_hz=62), "equal",
     [("frequency_hz", "The scheduling frequency must be 63-960 Hz, not 62.")]),
    (S("equal_share", arr=True, frequency_hz=961), "equal",
     [("frequency_hz", "The scheduling frequency must be 63-960 Hz, not 961.")]),
    (S("equal_share", arr=True, avg_factor=0), "equal",
     [("avg_factor", "The averaging factor must be 1-60, not 0.")]),
    (S("equal_share", arr=True, avg_factor=61), "equal",
     [("avg_factor", "The averaging factor must be 1-60, not 61.")]),
    (S("fixed_share", timeslice_ms=0), "equal", [("timeslice_ms", "The time slice must be 1-30 ms, not 0.")]),
    (S("fixed_share", timeslice_ms=31), "equal", [("timeslice_ms", "The time slice must be 1-30 ms, not 31.")]),
])
def test_every_validation_rule_has_its_message(wanted, size_mode, expected):
    assert messages(wanted, size_mode) == expected


@pytest.mark.parametrize("wanted", [
    S("equal_share", arr=True, frequency_hz=63, avg_factor=1),
    S("equal_share", arr=True, frequency_hz=960, avg_factor=60),
    S("fixed_share", timeslice_ms=1),
    S("fixed_share", timeslice_ms=30),
])
def test_range_limits_are_inclusive(wanted):
    assert messages(wanted) == []


def test_equal_share_is_fine_in_mixed_size_mode():
    assert messages(S("equal_share", arr=True), "mixed") == []
    assert messages(S("best_effort"), "mixed") == []


def test_defaults_follow_the_types_max_count():
    assert scheduler.defaults("equal_share", 8) == S("equal_share", arr=True, frequency_hz=480, avg_factor=33)
    assert scheduler.defaults("fixed_share", 16) == S("fixed_share", arr=True, frequency_hz=960, avg_factor=33)
    assert scheduler.defaults("best_effort", 16) == S("best_effort")
    assert scheduler.with_defaults(S("equal_share"), 4) == S("equal_share", timeslice_ms=2)
    assert scheduler.with_defaults(S("equal_share"), 32) == S("equal_share", timeslice_ms=1)
    assert scheduler.with_defaults(S("fixed_share", arr=True, avg_factor=10), 24) == S(
        "fixed_share", arr=True, frequency_hz=960, avg_factor=10)


def test_staging_reason_names_the_vgpu_count():
    assert scheduler.staging_reason(0) == ""
    assert scheduler.staging_reason(1) == "the GPU holds 1 vGPU; staged until it is empty or the driver reloads"
    assert scheduler.staging_reason(3) == "the GPU holds 3 vGPUs; staged until it is empty or the driver reloads"


REPORTED_EQUAL_ARR = {"policy": "equal_share", "arr_mode": "enabled", "avg_factor": 33, "timeslice_ms": 2.083,
                      "frequency_hz": 480}


def test_drift_lists_the_differing_fields():
    assert scheduler.drift(S("equal_share", arr=True, frequency_hz=480, avg_factor=33), REPORTED_EQUAL_ARR) == []
    assert scheduler.drift(S("equal_share", arr=True, frequency_hz=960, avg_factor=20), REPORTED_EQUAL_ARR) == [
        "frequency_hz", "avg_factor"]
    assert scheduler.drift(S("fixed_share", timeslice_ms=3), REPORTED_EQUAL_ARR) == ["policy", "arr", "timeslice_ms"]
    assert scheduler.drift(S("best_effort"), {"policy": "best_effort", "arr_mode": "default"}) == []
    # ARR is the driver's default for equal share.
    assert scheduler.drift(S("equal_share", arr=True), {"policy": "equal_share", "arr_mode": "default"}) == []
    assert scheduler.drift(S("fixed_share", timeslice_ms=3), None) == []


def test_linux_pci_address_of_an_nvml_bus_id():
    assert scheduler.linux_pci_address("00000000:86:00.0") == "0000:86:00.0"
    assert scheduler.linux_pci_address("00000000:3B:00.0") == "0000:3b:00.0"
