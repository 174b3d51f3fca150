"""Placeholder: an artist's workstation page (being built)."""
from django.http import HttpResponse


def workstation(request):
    return HttpResponse("workstation")
