"""Drain a failing GPU: ask the placement optimizer for a plan that moves every vGPU off it onto
the fleet's other GPUs (never onto it), for an admin to review and apply. On hosts linked to
their hypervisor the applied plan runs as operations; elsewhere it changes the inventory and
the admin moves the VMs."""

from __future__ import annotations

from alerts.models import Alert
from fleet.models import Gpu, Vgpu
from sizing import optimizer_runs
from sizing.models import OptimizerRun

NOTHING_TO_DRAIN = "Nothing to drain: this alert is not about a GPU, or it has ended."


class DrainRefused(Exception):
    """Why no drain plan was started (said to the admin as it is)."""


def start(gpu: Gpu, user) -> OptimizerRun:
    """Start an optimizer run that drains `gpu` (pending resize requests left out: a drain moves
    only the GPU's VMs). DrainRefused when the GPU holds no vGPU or another run is under way.
    The run may come back failed at once when the task queue is unreachable (its error says so)."""
    if not Vgpu.objects.filter(gpu=gpu).exists():
        raise DrainRefused(f"{gpu} runs no vGPU: there is nothing to move.")
    try:
        return optimizer_runs.start_run(user, include_requests=False, drain_gpu_ids=[gpu.pk])
    except optimizer_runs.RunInProgress as exc:
        raise DrainRefused(f"The optimizer is busy with run #{exc.run.pk}: drain again once it has finished.") \
            from None


def start_for_alert(alert: Alert, user) -> OptimizerRun:
    """`start` for the GPU of an open alert; DrainRefused for an alert about no GPU, or ended."""
    if alert.gpu_id is None or not alert.is_open:
        raise DrainRefused(NOTHING_TO_DRAIN)
    return start(alert.gpu, user)
