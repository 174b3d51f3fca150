"""Placeholder: the fleet overview (being built)."""
from django.http import HttpResponse


def overview(request):
    return HttpResponse("overview")


def overview_live(request):
    return HttpResponse("overview")
