"""Artists' feedback pages: the once-a-day prompt on /me/ (send a rating, or "Not now") and the
admins' trends (`/sizing/feedback/`).

Plain POST forms with CSRF that come back to /me/ with a message, so a rating never blocks the
page and needs no JavaScript. Every write goes through `sizing.feedback`, so the page and the API
refuse the same things in the same words; another artist's VM is a 403, as for resize requests.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from dashboard.access import staff_required
from dashboard.forms import FeedbackForm
from fleet.models import VirtualMachine
from sizing import feedback as service
from sizing import feedback_rules

#: Rows of the admins' list of recent ratings (the API and its CSV have them all).
RECENT_ROWS = 50


@login_required
@require_POST
def feedback_file(request, vm_pk: int):
    """The prompt's Send: store the day's rating of the artist's own VM and go back to /me/."""
    vm = get_object_or_404(VirtualMachine.objects.select_related("artist"), pk=vm_pk)
    if getattr(vm.artist, "user_id", None) != request.user.pk:
        raise PermissionDenied(service.NOT_YOURS)
    form = FeedbackForm(request.POST)
    if not form.is_valid():
        for errors in form.errors.values():
            for error in errors:
                messages.error(request, f"Feedback not sent: {error}")
        return redirect("fleet:workstation")
    data = form.cleaned_data
    try:
        feedback, created = service.file_feedback(request.user, vm, data["rating"], data["tags"], data["note"])
    except PermissionError as exc:
        raise PermissionDenied(str(exc)) from exc
    except service.FeedbackError as exc:
        for message in exc.errors.values():
            messages.error(request, f"Feedback not sent: {message}")
        return redirect("fleet:workstation")
    verb = "Thanks: " if created else "Updated today's rating: "
    messages.success(request, f"{verb}{vm.name} rated {feedback.rating} of 5 for {feedback.session_date}.")
    return redirect("fleet:workstation")


@login_required
@require_POST
def feedback_not_now(request):
    """The prompt's "Not now": not asked again until tomorrow."""
    service.dismiss_prompt(request.user)
    messages.info(request, "No problem: we will ask again tomorrow.")
    return redirect("fleet:workstation")


@staff_required
def feedback_trends(request):
    """Ratings per workflow and per host over the last four weeks (mean, count, the most picked
    tags, per week) and the latest ratings with their artists; no figures of one artist stand
    in the trends."""
    since, until = service.trend_window()
    context = {
        "since": since, "until": until,
        "by_workflow": service.trends("workflow", since, until),
        "by_host": service.trends("host", since, until),
        "recent": list(service.feedback_for(request.user).filter(session_date__gte=since)[:RECENT_ROWS]),
        "recent_rows": RECENT_ROWS,
        "tag_labels": feedback_rules.TAG_LABELS,
    }
    return render(request, "sizing/feedback.html", context)
