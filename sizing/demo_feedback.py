"""The demo's artists' feedback: two working weeks of ratings for every demo VM that has an
artist, as those artists would give them given their workflow (`manage.py demo_feedback`, run
by `make run` before the suggestions are refreshed, so their evidence and confidence show it).

Deterministic: a VM's ratings follow from its name and the day, so a second run writes the same
rows (the one-rating-a-VM-and-day rule keeps a rerun from adding any).
- animation: bad days (the viewport stutters on one saturated vCPU, the frame buffer runs out);
- lighting, rendering, fx: mixed (scenes slow to open while renders run);
- compositing: display lag now and then;
- modeling, texturing, shading, layout, other: content.
"""

from __future__ import annotations

import hashlib
from datetime import date, timedelta

from django.utils import timezone

from fleet.models import VirtualMachine
from sizing.models import Feedback

WORKING_DAYS = 10
#: Per workflow: (ratings to draw from, the tags of a day rated 1-2 or 3).
PATTERNS = {
    "animation": ((2, 2, 3, 1, 2, 4), ("viewport_stutter", "out_of_gpu_memory")),
    "lighting": ((3, 4, 2, 3, 4), ("slow_scene_open",)),
    "rendering": ((3, 4, 3, 4), ("slow_scene_open",)),
    "fx": ((3, 4, 2, 4), ("slow_scene_open",)),
    "compositing": ((4, 3, 4, 2, 4), ("display_lag",)),
}
CONTENT = ((5, 4, 5, 5, 4), ())


def _pick(key: str, choices: tuple) -> object:
    return choices[int(hashlib.sha256(key.encode()).hexdigest(), 16) % len(choices)]


def working_days(until: date, count: int = WORKING_DAYS) -> list[date]:
    """The last `count` weekdays before `until`, oldest first."""
    days, day = [], until
    while len(days) < count:
        day -= timedelta(days=1)
        if day.weekday() < 5:
            days.append(day)
    return sorted(days)


def seed_feedback(today: date | None = None) -> int:
    """Write the demo ratings (see the module docstring); returns how many were new."""
    today = today or timezone.localdate()
    rows = []
    for vm in VirtualMachine.objects.filter(artist__isnull=False).select_related("artist__user").order_by("name"):
        ratings, tags = PATTERNS.get(vm.artist.workflow, CONTENT)
        for day in working_days(today):
            rating = _pick(f"{vm.name}:{day}:rating", ratings)
            picked = [_pick(f"{vm.name}:{day}:tag", tags)] if tags and rating <= 3 else []
            rows.append(Feedback(artist=vm.artist, vm=vm, host_id=vm.host_id, rating=rating,
                                 tags=picked or (["fine"] if rating >= 4 else []), session_date=day,
                                 created_by=vm.artist.user))
    before = Feedback.objects.count()
    Feedback.objects.bulk_create(rows, ignore_conflicts=True)
    return Feedback.objects.count() - before
