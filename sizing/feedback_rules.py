"""Artists' feedback on their workstations, as plain figures: which quick tags exist, which
combinations make sense, and the summary of a set of ratings that the right-sizing evidence and
the admins' trends show.

No ORM here, so the rules are tested without a database; `sizing.feedback` stores and reads
the rows and calls these.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import date, timedelta

#: The quick tags an artist may pick, with what the form says.
TAG_LABELS = {
    "viewport_stutter": "Viewport stutter",
    "out_of_gpu_memory": "Out of GPU memory",
    "slow_scene_open": "Slow to open scenes",
    "display_lag": "Display lag",
    "fine": "Fine",
}
TAGS = tuple(TAG_LABELS)
FINE = "fine"
PROBLEM_TAGS = tuple(tag for tag in TAGS if tag != FINE)

RATING_MIN = 1
RATING_MAX = 5
#: A rating at or below this counts as a bad day (strengthens an upsize of a saturated vGPU).
LOW_RATING = 2
#: A rating at or above this counts as a good day (supports a downsize of a little-used vGPU).
HIGH_RATING = 4
NOTE_MAX_CHARS = 1000


def tag_errors(tags: Sequence[str]) -> list[str]:
    """What is wrong with `tags`, in words (empty when they are fine): unknown tags, and `fine`
    picked together with a problem, which would contradict itself."""
    errors = []
    unknown = [tag for tag in tags if tag not in TAG_LABELS]
    if unknown:
        errors.append(f"Unknown tag {', '.join(repr(str(tag)) for tag in unknown)}; "
                      f"choose among {', '.join(TAGS)}.")
    if FINE in tags and any(tag in PROBLEM_TAGS for tag in tags):
        errors.append("'fine' cannot go with a problem tag: pick either fine or what went wrong.")
    return errors


def clean_tags(tags: Iterable[str]) -> list[str]:
    """`tags` without repeats, in the order of TAGS (so equal picks store equally)."""
    picked = set(tags)
    return [tag for tag in TAGS if tag in picked]


def feedback_summary(ratings: Iterable[tuple[date, int, Sequence[str]]]) -> dict:
    """The figures of a set of ratings, each `(day, rating, tags)`: `count`, `mean` (rounded to
    two decimals; None without ratings), `low_share` and `high_share` (the share of ratings at
    or below LOW_RATING, at or above HIGH_RATING, 0..1, rounded to three decimals) and `tags`:
    for each tag the share of ratings that carry it (tags nobody picked are left out), most
    frequent first. Days are not used here; they let a caller pass rows as they come."""
    count = 0
    total = low = high = 0
    tags: Counter[str] = Counter()
    for _day, rating, picked in ratings:
        count += 1
        total += rating
        low += rating <= LOW_RATING
        high += rating >= HIGH_RATING
        tags.update(set(picked))
    if not count:
        return {"count": 0, "mean": None, "low_share": 0.0, "high_share": 0.0, "tags": {}}
    ordered = sorted(tags.items(), key=lambda item: (-item[1], TAGS.index(item[0]) if item[0] in TAGS else 99))
    return {
        "count": count,
        "mean": round(total / count, 2),
        "low_share": round(low / count, 3),
        "high_share": round(high / count, 3),
        "tags": {tag: round(n / count, 3) for tag, n in ordered},
    }


def top_tags(summary: dict, count: int = 3) -> list[tuple[str, float]]:
    """The `count` most picked tags of a `feedback_summary`, as (label, share), most picked first."""
    return [(TAG_LABELS.get(tag, tag), share) for tag, share in list(summary["tags"].items())[:count]]


def week_start(day: date) -> date:
    """The Monday of `day`'s week: trends are per ISO week."""
    return day - timedelta(days=day.weekday())


def weekly(ratings: Iterable[tuple[date, int, Sequence[str]]]) -> list[dict]:
    """`feedback_summary` per week (by Monday, oldest first), each with its `week` added."""
    weeks: dict[date, list] = {}
    for row in ratings:
        weeks.setdefault(week_start(row[0]), []).append(row)
    return [{"week": monday, **feedback_summary(rows)} for monday, rows in sorted(weeks.items())]


#: A share of days (0..1) that counts as "often" when feedback bears on the advice.
OFTEN = 0.3
#: A share of days (0..1) that counts as "most".
MOST = 0.7
#: Tags that say the vGPU itself is short (its frame buffer or its time slice).
VGPU_TAGS = ("out_of_gpu_memory", "viewport_stutter")


def confidence(action: str, summary: dict) -> dict:
    """How the artist's own ratings (`feedback_summary`) move the confidence of the vGPU advice
    `action` (upsize, downsize, keep, insufficient_data): {"level": high | medium | low, "why"}.
    A low rating with a saturated vGPU strengthens an upsize; a high rating at low use supports a
    downsize; the other way round each is weaker. Without ratings the level is medium: the
    figures alone."""
    count = summary.get("count", 0)
    if not count:
        return {"level": "medium", "why": "No feedback from the artist in the window: the figures alone."}
    days = f"{count} day{'s' if count != 1 else ''} rated"
    low, high, tags = summary["low_share"], summary["high_share"], summary.get("tags", {})
    vgpu_trouble = max((tags.get(tag, 0.0) for tag in VGPU_TAGS), default=0.0)
    named = ", ".join(f"{TAG_LABELS[tag][0].lower()}{TAG_LABELS[tag][1:]} {tags[tag]:.0%}"
                      for tag in VGPU_TAGS if tags.get(tag))
    if action == "upsize":
        if low >= OFTEN or vgpu_trouble >= OFTEN:
            return {"level": "high", "why": f"The artist confirms it: {days}, {low:.0%} of them 1-2 stars"
                                            + (f" ({named})." if named else ".")}
        if high >= MOST:
            return {"level": "low", "why": f"The artist rates most days well ({high:.0%} of {days} at 4-5 "
                                           "stars): ask before upsizing."}
    if action == "downsize":
        if low >= OFTEN or vgpu_trouble >= OFTEN:
            return {"level": "low", "why": f"The artist reports bad days ({low:.0%} of {days} at 1-2 stars"
                                           + (f"; {named}" if named else "") + "): do not downsize before asking."}
        if high >= MOST:
            return {"level": "high", "why": f"The artist rates {high:.0%} of {days} at 4-5 stars at this use: "
                                            "a smaller profile should go unnoticed."}
    if action == "keep" and low >= MOST:
        return {"level": "low", "why": f"The artist rates {low:.0%} of {days} at 1-2 stars although the figures "
                                       "look right: look at the CPU, the RAM and the display path."}
    return {"level": "medium", "why": f"{days}, mean {summary['mean']:.1f} stars: in line with the figures."}
