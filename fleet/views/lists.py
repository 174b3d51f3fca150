"""Placeholder: list pages (being built)."""
from django.http import HttpResponse
from django.views import View


class _Placeholder(View):
    def get(self, request):
        return HttpResponse("list")


HostListView = GpuListView = VmListView = ArtistListView = _Placeholder
