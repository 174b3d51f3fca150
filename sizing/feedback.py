"""Artists' feedback on their workstations: filing a day's rating, the once-a-day prompt, and
the reads the pages, the API and the right-sizing evidence share.

Privacy rule (the feature's acceptance): an artist reads only the ratings they filed
themselves (`feedback_for`); admins read all of them with the artists' names, as they see
artists everywhere else; the trends are for admins and carry no names. A rating is filed only
by the VM's own artist: an admin does not rate on an artist's behalf.

A second rating of the same VM and day replaces the first (the artist changed their mind about
the day), rather than being refused: the prompt and the API both say so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from django.db import transaction
from django.db.models import F, QuerySet
from django.utils import timezone

from config.roles import is_fleet_admin
from fleet.models import Artist, VirtualMachine
from sizing import feedback_rules
from sizing.models import Feedback, FeedbackPrompt

#: How far back a day may be rated: memory of how a day felt fades fast.
MAX_DAYS_BACK = 14
#: The trends' default window: the last four weeks.
TRENDS_DAYS = 28
NOT_YOURS = "You may only rate your own workstation."
GROUPS = ("workflow", "host")


class FeedbackError(ValueError):
    """Bad input for a rating, as {field: message}; the API answers 400, the page shows the messages."""

    def __init__(self, errors: dict[str, str]):
        super().__init__("; ".join(errors.values()))
        self.errors = errors


def _is_owner(user, vm: VirtualMachine) -> bool:
    artist = vm.artist
    return bool(user and user.is_authenticated and artist is not None and artist.user_id == user.pk)


def validation_errors(rating, tags, note, day: date | None, today: date) -> dict[str, str]:
    """What is wrong with a rating's fields, in words, by field (empty when all is well)."""
    errors = {}
    if isinstance(rating, bool) or not isinstance(rating, int) or not (
            feedback_rules.RATING_MIN <= rating <= feedback_rules.RATING_MAX):
        errors["rating"] = (f"Choose a rating from {feedback_rules.RATING_MIN} to {feedback_rules.RATING_MAX} "
                            f"stars (not {str(rating)[:20]}).")
    if not isinstance(tags, list | tuple) or not all(isinstance(tag, str) for tag in tags):
        errors["tags"] = "Tags are a list of names: " + ", ".join(feedback_rules.TAGS) + "."
    elif problems := feedback_rules.tag_errors(tags):
        errors["tags"] = " ".join(problems)
    if not isinstance(note, str):
        errors["note"] = "The note is text."
    elif len(note) > feedback_rules.NOTE_MAX_CHARS:
        errors["note"] = (f"Keep the note to {feedback_rules.NOTE_MAX_CHARS} characters "
                          f"(it has {len(note)}).")
    if day is not None:
        if day > today:
            errors["session_date"] = f"Rate today ({today}) or an earlier day, not {day}."
        elif day < today - timedelta(days=MAX_DAYS_BACK):
            first = today - timedelta(days=MAX_DAYS_BACK)
            errors["session_date"] = f"Rate a day of the last {MAX_DAYS_BACK} days (from {first} on), not {day}."
    return errors


def file_feedback(user, vm: VirtualMachine, rating: int, tags: Sequence[str] = (), note: str = "",
                  day: date | None = None) -> tuple[Feedback, bool]:
    """Store `user`'s rating of `vm` for `day` (today in TIME_ZONE by default) and return it with
    whether it is new. A rating of the same VM and day already there is replaced.

    Raises PermissionError when `vm` is not the user's own (admins included: nobody rates for
    someone else), FeedbackError with a message per field when a value is wrong; nothing is
    stored then."""
    # Read afresh: the caller's object may predate a placement or a change of artist.
    vm = VirtualMachine.objects.select_related("artist").get(pk=vm.pk)
    if not _is_owner(user, vm):
        raise PermissionError(NOT_YOURS)
    today = timezone.localdate()
    errors = validation_errors(rating, tags, note, day, today)
    if errors:
        raise FeedbackError(errors)
    with transaction.atomic():
        feedback, created = Feedback.objects.update_or_create(
            vm=vm, session_date=day or today,
            defaults={"artist": vm.artist, "host_id": vm.host_id, "rating": rating,
                      "tags": feedback_rules.clean_tags(tags), "note": note.strip(), "created_by": user},
        )
    return feedback, created


def dismiss_prompt(user, now: datetime | None = None) -> None:
    """"Not now": the day's prompt is not shown again until tomorrow (in TIME_ZONE). Safe to repeat."""
    now = now or timezone.now()
    FeedbackPrompt.objects.get_or_create(user=user, day=timezone.localdate(now), defaults={"dismissed_at": now})


def prompt_due(user, now: datetime | None = None) -> list[VirtualMachine]:
    """The VMs `user` should be asked about today, by name: their own VMs not rated today, unless
    they said "Not now" today (then none until tomorrow). Two queries; none for a user who is
    not an artist. The prompt never blocks anything: it is a card on their page."""
    if not (user and user.is_authenticated):
        return []
    today = timezone.localdate(now or timezone.now())
    if FeedbackPrompt.objects.filter(user=user, day=today).exists():
        return []
    return list(VirtualMachine.objects.filter(artist__user=user).exclude(
        feedback__session_date=today).order_by("name"))


def feedback_for(user) -> QuerySet[Feedback]:
    """The ratings `user` may read: all for an admin, the ones they filed as an artist (not those
    of a previous artist of their VM), none for anonymous; newest day first, with VM, artist and
    host loaded (one query for a list of any length)."""
    if not (user and user.is_authenticated):
        return Feedback.objects.none()
    queryset = Feedback.objects.all()
    if not is_fleet_admin(user):
        queryset = queryset.filter(artist__user=user)
    return queryset.select_related("vm", "artist", "host").order_by("-session_date", "-id")


def recent_own(user, limit: int = 10) -> list[Feedback]:
    """The artist's own last ratings, newest first, for the Feedback section of their page."""
    if not (user and user.is_authenticated):
        return []
    return list(Feedback.objects.filter(artist__user=user).select_related("vm").order_by(
        "-session_date", "-id")[:limit])


def ratings_by_vm(since: date, vm_ids: Sequence[int] | None = None) -> dict[int, list[tuple[date, int, list[str]]]]:
    """By VM (every VM, or those of `vm_ids`), its artist's ratings from `since` on, oldest
    first, as `(day, rating, tags)`: what `feedback_rules.feedback_summary` takes, for the
    suggestion's evidence. Only those of the VM's artist now: a VM handed to another artist does
    not carry the last one's ratings into the evidence the new one reads. Notes are left out;
    the caller shows them to admins or the VM's own artist only. One query."""
    rows = Feedback.objects.filter(session_date__gte=since, artist_id=F("vm__artist_id"))
    if vm_ids is not None:
        rows = rows.filter(vm_id__in=vm_ids)
    ratings: dict[int, list[tuple[date, int, list[str]]]] = {}
    for vm_id, day, rating, tags in rows.order_by("vm_id", "session_date", "id").values_list(
            "vm_id", "session_date", "rating", "tags"):
        ratings.setdefault(vm_id, []).append((day, rating, list(tags)))
    return ratings


@dataclass(frozen=True)
class TrendRow:
    """One workflow's or host's figures over the window: the summary and the same per week."""

    key: str
    label: str
    summary: dict
    weeks: list[dict]

    @property
    def top_tags(self) -> list[tuple[str, float]]:
        """The three most picked tags as (label, share), `fine` included."""
        return feedback_rules.top_tags(self.summary)

    def as_dict(self) -> dict:
        return {"key": self.key, "label": self.label, **self.summary,
                "weeks": [{**week, "week": week["week"].isoformat()} for week in self.weeks]}


def trend_window(since: date | None = None, until: date | None = None) -> tuple[date, date]:
    """The days the trends cover: `until` (default today in TIME_ZONE) and `since` (default four
    weeks before it, `until` included)."""
    until = until or timezone.localdate()
    return since or until - timedelta(days=TRENDS_DAYS - 1), until


def trends(group: str, since: date | None = None, until: date | None = None) -> list[TrendRow]:
    """Ratings per workflow (the artist's) or per host (the VM's on the day rated) from `since`
    (default: the last four weeks) to `until` (default today): count, mean rating, the share of
    each tag, and the same per week. For admins only; no artist is named. Rows by label; a VM
    with no host that day counts under "no host". One query."""
    if group not in GROUPS:
        raise ValueError(f"group is one of {', '.join(GROUPS)}, not {group!r}")
    since, until = trend_window(since, until)
    key_field = "artist__workflow" if group == "workflow" else "host__name"
    rows: dict[str, list] = {}
    for key, day, rating, tags in Feedback.objects.filter(session_date__gte=since, session_date__lte=until).values_list(
            key_field, "session_date", "rating", "tags").order_by("session_date", "id"):
        rows.setdefault(key or "", []).append((day, rating, tags))
    workflows = dict(Artist._meta.get_field("workflow").choices)
    result = []
    for key, ratings in rows.items():
        label = workflows.get(key, key) if group == "workflow" else (key or "no host")
        result.append(TrendRow(key=key, label=str(label), summary=feedback_rules.feedback_summary(ratings),
                               weeks=feedback_rules.weekly(ratings)))
    return sorted(result, key=lambda row: row.label.lower())
