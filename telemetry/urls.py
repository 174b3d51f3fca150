"""Routes of the telemetry HTML pages (namespace `telemetry`), mounted at the site root."""

from django.urls import path

from telemetry.views import agents, heatmap

app_name = "telemetry"

urlpatterns = [
    path("heatmap/", heatmap.heatmap_page, name="heatmap"),
    path("agents/", agents.AgentListView.as_view(), name="agent-list"),
]
