"""Routes of the v1 inventory API, mounted at /api/v1/ (plural kebab-case, DESIGN.md)."""

from config.routers import DefaultRouter
from fleet.api import audit as audit_api
from fleet.api import notifications as notifications_api
from fleet.api import requests as requests_api
from fleet.api import scheduler as scheduler_api
from fleet.api import views

router = DefaultRouter()
router.register("gpu-models", views.GpuModelViewSet, basename="gpumodel")
router.register("vgpu-profiles", views.VgpuProfileViewSet, basename="vgpuprofile")
router.register("hosts", views.HostViewSet, basename="host")
router.register("gpus", views.GpuViewSet, basename="gpu")
router.register("artists", views.ArtistViewSet, basename="artist")
router.register("vms", views.VirtualMachineViewSet, basename="virtualmachine")
router.register("vgpus", views.VgpuViewSet, basename="vgpu")
# --- resize requests (fleet/api/requests.py) ---
router.register("resize-requests", requests_api.ResizeRequestViewSet, basename="resizerequest")
# --- notifications (fleet/api/notifications.py) ---
router.register("notifications", notifications_api.NotificationViewSet, basename="notification")
# --- scheduler policies (fleet/api/scheduler.py) ---
# --- audit log (fleet/api/audit.py) ---
router.register("audit-events", audit_api.AuditEventViewSet, basename="auditevent")

urlpatterns = [
    # --- scheduler policies: gpus/{id}/scheduler/ (fleet/api/scheduler.py) ---
    *scheduler_api.urlpatterns,
    *router.urls,
]
