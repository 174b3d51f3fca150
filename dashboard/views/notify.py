"""/alerts/channels/ and /alerts/deliveries/: where alerts go, and what was sent. Admins only.

The channel list shows each channel's last delivery (one query); a channel's page edits it,
sends a test message (the outcome shown as a message) and lists its latest deliveries. A
webhook created without a secret gets one, shown once on the page that answers the creation.
"""

from __future__ import annotations

from django.contrib import messages
from django.db.models import QuerySet
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from dashboard import tables
from dashboard.access import staff_required
from dashboard.listing import TableListView
from notify import queries, services
from notify.choices import DeliveryStatus
from notify.filtersets import DeliveryFilterSet, NotificationChannelFilterSet
from notify.forms import NotificationChannelForm
from notify.models import NotificationChannel

#: Deliveries listed on a channel's page (the history page has them all).
RECENT_DELIVERIES = 10


class ChannelListView(TableListView):
    table_class = tables.NotificationChannelTable
    filterset_class = NotificationChannelFilterSet
    template_name = "notify/channel_list.html"
    filter_fields = ("kind", "enabled")
    noun = "channels"
    csv_name = None

    def get_queryset(self) -> QuerySet:
        return queries.channels_with_last_delivery()

    def get_extra_context(self) -> dict:
        return {"title": "Notification channels", "empty_title": "No channels yet",
                "empty_message": "Add a channel so that alerts reach someone: e-mail, a webhook, Slack or the app."}


class DeliveryListView(TableListView):
    table_class = tables.DeliveryTable
    filterset_class = DeliveryFilterSet
    template_name = "notify/delivery_list.html"
    filter_fields = ("channel", "status", "severity")
    noun = "deliveries"
    csv_name = "deliveries"

    def get_queryset(self) -> QuerySet:
        return queries.deliveries()

    def get_extra_context(self) -> dict:
        return {"title": "Deliveries", "empty_title": "Nothing sent yet",
                "empty_message": "Every message sent to a channel (alerts, tests) is listed here with its outcome."}


def _form_page(request, form, channel: NotificationChannel | None, status: int = 200, secret: str | None = None):
    recent = list(queries.deliveries().filter(channel=channel)[:RECENT_DELIVERIES]) if channel else []
    return render(request, "notify/channel_form.html",
                  {"form": form, "channel": channel, "recent": recent, "secret_once": secret,
                   "title": channel.name if channel else "New notification channel"}, status=status)


@staff_required
def channel_create(request):
    form = NotificationChannelForm(request.POST or None)
    if request.method != "POST":
        return _form_page(request, form, None)
    if not form.is_valid():
        return _form_page(request, form, None, status=400)
    channel, secret = services.save_channel(NotificationChannel(), **form.changes())
    messages.success(request, f"Channel {channel.name} was created.")
    if secret:
        return _form_page(request, NotificationChannelForm(instance=channel), channel, secret=secret)
    return redirect("notify:channel-edit", pk=channel.pk)


@staff_required
def channel_edit(request, pk: int):
    channel = get_object_or_404(NotificationChannel, pk=pk)
    form = NotificationChannelForm(request.POST or None, instance=channel)
    if request.method != "POST":
        return _form_page(request, form, channel)
    if not form.is_valid():
        return _form_page(request, form, get_object_or_404(NotificationChannel, pk=pk), status=400)
    services.save_channel(get_object_or_404(NotificationChannel, pk=pk), **form.changes())
    messages.success(request, f"Channel {form.cleaned_data['name']} was saved.")
    return redirect("notify:channel-edit", pk=pk)


@require_POST
@staff_required
def channel_test(request, pk: int):
    """Send a test message now and say how it went."""
    channel = get_object_or_404(NotificationChannel, pk=pk)
    delivery = services.send_test(channel)
    if delivery.status == DeliveryStatus.SENT:
        messages.success(request, f"Test message sent to {channel.name}"
                                  f"{f' (HTTP {delivery.response_status})' if delivery.response_status else ''}.")
    else:
        retry = (f" It is tried again at {delivery.next_attempt_at:%H:%M:%S} UTC."
                 if delivery.status == DeliveryStatus.RETRYING else "")
        messages.error(request, f"The test message to {channel.name} failed: {delivery.last_error}.{retry}")
    return redirect("notify:channel-edit", pk=pk)


@require_POST
@staff_required
def channel_delete(request, pk: int):
    channel = get_object_or_404(NotificationChannel, pk=pk)
    services.delete_channel(channel)
    messages.success(request, f"Channel {channel.name} was deleted; its deliveries stay in the history.")
    return redirect("notify:channel-list")
