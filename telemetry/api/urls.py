"""Routes of the v1 telemetry API, mounted at /api/v1/ after the fleet routes (config/urls.py).

Each resource keeps its own block, so adding one touches no other line.
"""

from django.urls import path

from config.routers import AppRouter
from telemetry.api import agents, gpus, heatmap, ingest, metrics, scheduler

urlpatterns = []

# agents/: the sources we collect from (staff only).
router = AppRouter()
router.register("agents", agents.AgentViewSet, basename="agent")
router.register("gpus", gpus.GpuViewSet, basename="gpu")
urlpatterns += router.urls

urlpatterns += scheduler.urlpatterns

# hosts/{id}/driver/: the NVIDIA software a host's agent reports (read-only).
urlpatterns += gpus.urlpatterns

# gpus/{id}/metrics/, vms/{id}/metrics/: time series from the rollups.
urlpatterns += [
    path("gpus/<int:pk>/metrics/", metrics.GpuMetricsView.as_view(), name="gpu-metrics"),
    path("vms/<int:pk>/metrics/", metrics.VmMetricsView.as_view(), name="vm-metrics"),
]

# ingest/nvidia-smi/: hosts without an agent push nvidia-smi -q -x documents (agent token).
urlpatterns += [
    path("ingest/nvidia-smi/", ingest.NvidiaSmiIngestView.as_view(), name="ingest-nvidia-smi"),
]

# heatmap/: GPU x time, VM x time and host x hour-of-week matrices from the rollups.
urlpatterns += [
    path("heatmap/", heatmap.HeatmapView.as_view(), name="heatmap-api"),
]
