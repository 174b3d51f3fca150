"""Placeholder: the agents page (being built)."""
from django.http import HttpResponse
from django.views import View


class AgentListView(View):
    def get(self, request):
        return HttpResponse("agents")
