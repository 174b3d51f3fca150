"""What approving a resize request will do, shown before it is done.

The admin's confirm step lists the VM that changes, from which GPUs and host to which, and
whether it must be shut down (on real vGPU every change of a VM's vGPUs does: a vGPU is
created and destroyed only while its VM is powered off, so a resize in place and a move
alike stop the workstation; ../shared/reference/vgpu-facts.md). Its `fingerprint` digests
what the admin saw and the state of every GPU involved, so a confirmation posted after the
fleet changed is refused rather than applying something nobody looked at.

Where the request would go comes from `fleet.requests` through one adapter, `_destination`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from fleet import requests as resize_requests
from fleet.choices import ResizeStatus
from fleet.models import Gpu, ResizeRequest, Vgpu

#: The confirm step's answer when the fingerprint posted is not the one of the fleet now.
FLEET_CHANGED = ("The fleet changed since you reviewed this approval (a vGPU was placed, removed or moved on "
                 "a GPU it involves, the VM's vCPUs or RAM changed, or its host's room did): review the changes "
                 "again before you confirm.")
NOT_CONFIRMED = "Review the changes and confirm them to approve the request; nothing was changed."


@dataclass(frozen=True)
class Place:
    """One GPU as the confirm step names it."""

    host: str
    gpu: str  # the PCI bus id

    def __str__(self) -> str:
        return f"{self.host} {self.gpu}"


@dataclass(frozen=True)
class VmChange:
    """One VM the approval changes: where its vGPUs are and will be, and why it stops."""

    vm_id: int
    vm: str
    before: str  # e.g. "1 × RTX6000-12Q"
    after: str
    from_places: tuple[Place, ...]
    to_places: tuple[Place, ...]
    shutdown: bool
    why: str

    @property
    def moves_host(self) -> bool:
        return {p.host for p in self.from_places} != {p.host for p in self.to_places} and bool(self.from_places)


@dataclass(frozen=True)
class Preview:
    """The confirm step of one approval: the changes, or why it cannot be applied now."""

    request_id: int
    changes: tuple[VmChange, ...]
    refusal: str
    fingerprint: str

    @property
    def can_apply(self) -> bool:
        return not self.refusal and bool(self.changes)

    @property
    def shutdowns(self) -> list[str]:
        return [change.vm for change in self.changes if change.shutdown]


def _destination(request: ResizeRequest) -> tuple[str, tuple[Place, ...], str]:
    """Where `request` would go now, as (where, places, refusal): the one adapter over
    fleet.requests' answer ("same_gpu", "other_gpu", "other_host" or "nowhere")."""
    fit = resize_requests.fits(request)
    if fit.where == "nowhere":
        return fit.where, (), fit.reason or "No GPU has room for it now."
    return fit.where, tuple(Place(fit.host, label) for label in fit.gpus), ""


WHY = {
    "same_gpu": "its vGPU is recreated with the new profile on the same GPU",
    "other_gpu": "its vGPUs move to another GPU of the same host",
    "other_host": "its vGPUs move to another host",
}


#: Why a change of vCPUs or RAM alone stops the VM: the operation redefines it while powered off.
RESIZED = "its vCPUs and RAM change; it keeps its vGPUs"


def _digest(parts: list[str]) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def preview(request: ResizeRequest) -> Preview:
    """What approving `request` would do now, with the fingerprint its confirmation must carry."""
    held = list(Vgpu.objects.filter(vm_id=request.vm_id).select_related("gpu__host", "profile").order_by("pk"))
    from_places = tuple(dict.fromkeys(Place(v.gpu.host.name, v.gpu.label) for v in held))
    before = f"{len(held)} × {held[0].profile.name}" if held else "no vGPU"
    after = f"{request.requested_vgpus} × {request.requested_profile.name}"
    kept = resize_requests.keeps_vgpus(request, [v.profile_id for v in held])
    if request.changes_size:
        vm = request.vm
        before += f", {vm.vcpus} vCPUs, {vm.ram_gib} GiB"
        after += ", {} vCPUs, {} GiB".format(*resize_requests.size_of(request, vm))
    if request.status != ResizeStatus.PENDING:
        refusal, where, to_places = f"The request is {request.get_status_display().lower()} already.", "", ()
    else:
        where, to_places, refusal = _destination(request)
    changes = () if refusal else (VmChange(
        vm_id=request.vm_id, vm=request.vm.name, before=before, after=after, from_places=from_places,
        to_places=to_places, shutdown=True, why=RESIZED if kept else WHY.get(where, "its vGPUs change"),
    ),)
    # The GPUs involved, as they are now: a vGPU placed on or removed from any of them since the
    # admin looked changes the fingerprint even where the answer happens to stay the same.
    gpu_ids = {v.gpu_id for v in held}
    for place in to_places:
        gpu_ids.update(Gpu.objects.filter(host__name=place.host, pci_bus_id=place.gpu).values_list("pk", flat=True))
    occupancy = Vgpu.objects.filter(gpu_id__in=gpu_ids).order_by("gpu_id", "pk").values_list(
        "gpu_id", "pk", "vm_id", "profile_id")
    parts = [f"request {request.pk} {request.status} {request.requested_profile_id} {request.requested_vgpus} "
             f"{request.requested_vcpus} {request.requested_ram_gib}",
             f"refusal {refusal}", *(repr(change) for change in changes), *(repr(row) for row in occupancy)]
    return Preview(request_id=request.pk, changes=changes, refusal=refusal, fingerprint=_digest(parts))
