"""Whether a resize that fits nowhere as the fleet stands would fit if other VMs moved.

The request queue says "fits only if N other VMs move" rather than "fits nowhere" when that is
the truth, with the optimizer run that makes the room one click away. The answer is the
placement optimizer's (`sizing.optimizer.optimize`) for the fleet with this one change, under
a short time limit, so the queue asks for it per row and lazily (an htmx fragment).
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet.queries import fleet_snapshot
from fleet.snapshot import FleetSnapshot
from sizing import optimizer

#: How long one row's search may take; the queue loads each row's answer on its own.
TIME_LIMIT_S = 2.0


@dataclass(frozen=True)
class Room:
    """`others`: the VMs besides the resized one that the optimizer's plan moves (names in
    `moved`), None when even moving others finds no room (`reason` says why)."""

    others: int | None
    moved: tuple[str, ...] = ()
    reason: str = ""

    @property
    def fits_by_moving(self) -> bool:
        return self.others is not None


def room_in(snapshot: FleetSnapshot, vm_id: int, profile_id: int, vgpus: int, *,
            time_limit_s: float = TIME_LIMIT_S) -> Room:
    """The room a resize of VM `vm_id` to `vgpus` x profile `profile_id` finds in `snapshot`
    when the optimizer may move other VMs (pure: no database)."""
    change = optimizer.Change(vm_id=vm_id, profile_id=profile_id, vgpus=vgpus, source="room")
    plan = optimizer.optimize(snapshot, [change], time_limit_s=time_limit_s)
    refused = dict(plan.unplaced)
    if vm_id in refused:
        return Room(None, reason=refused[vm_id])
    moved = tuple(sorted(move.vm_name for move in plan.moves if move.vm_id != vm_id))
    return Room(len(moved), moved)


def room_for(vm_id: int, profile_id: int, vgpus: int) -> Room:
    """`room_in` on the fleet as it is now."""
    return room_in(fleet_snapshot(), vm_id, profile_id, vgpus)
