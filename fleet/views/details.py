"""Placeholder: detail pages (being built)."""
from django.http import HttpResponse


def host_detail(request, pk):
    return HttpResponse("host")


def gpu_detail(request, pk):
    return HttpResponse("gpu")


def vm_detail(request, pk):
    return HttpResponse("vm")


def artist_detail(request, pk):
    return HttpResponse("artist")
