"""Signals fleet sends so the apps above it can act on its decisions without fleet importing them.

`change_approved` is sent inside the approval's transaction, after the inventory shows the
change: a receiver that carries the change out elsewhere (the hypervisors app, for a host linked
to its hypervisor) returns what it created, and fleet then records the request as being applied
rather than applied. A receiver that raises FleetConflict refuses the approval whole.
"""

from django.dispatch import Signal

#: kwargs: request (ResizeRequest, locked), before (list of the VM's vGPUs as they were: dicts of
#: gpu_id, profile_id, placement_id, device_id), placed (list of Vgpu), actor (the admin),
#: size_before ({"vcpus", "ram_gib"} of the VM as it was; the VM row holds the new ones) and
#: vgpus_kept (True when the request changes the VM's vCPUs or RAM alone: `placed` are the
#: vGPUs it held, untouched).
change_approved = Signal()
