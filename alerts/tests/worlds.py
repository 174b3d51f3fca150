"""Alerts as the evaluation stores them, for the tests of what an admin does with one."""

from __future__ import annotations

from alerts.evaluate import ensure_rules
from alerts.models import Alert, AlertState, Severity


def gpu_alert(gpu, *, state: str = AlertState.FIRING, rule: str = "xid") -> Alert:
    """An alert of `rule` about `gpu` (None: an alert about no GPU), naming the VMs on it."""
    rules = ensure_rules()
    alert = Alert.objects.create(
        rule=rules[rule], key=f"{rule}:{gpu.pk if gpu else 'fleet'}", state=state, severity=Severity.CRITICAL,
        title=f"XID 79 on {gpu}" if gpu else "Licence pool exhausted", summary="The GPU has fallen off the bus.",
        host=gpu.host if gpu else None, gpu=gpu,
    )
    if gpu is not None:
        alert.vms.set({vgpu.vm for vgpu in gpu.vgpus.select_related("vm")})
    return alert
