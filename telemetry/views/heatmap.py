"""Placeholder: the heatmap page (being built)."""
from django.http import HttpResponse


def heatmap_page(request):
    return HttpResponse("heatmap")
