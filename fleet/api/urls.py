"""Routes of the v1 inventory API, mounted at /api/v1/ (plural kebab-case, DESIGN.md)."""

from config.routers import AppRouter
from fleet.api import audit as audit_api
from fleet.api import notifications as notifications_api
from fleet.api import requests as requests_api
from fleet.api import tokens as tokens_api
from fleet.api import views

router = AppRouter()
router.register("gpu-models", views.GpuModelViewSet, basename="gpumodel")
router.register("vgpu-profiles", views.VgpuProfileViewSet, basename="vgpuprofile")
router.register("hosts", views.HostViewSet, basename="host")
router.register("artists", views.ArtistViewSet, basename="artist")
router.register("vms", views.VirtualMachineViewSet, basename="virtualmachine")
router.register("vgpus", views.VgpuViewSet, basename="vgpu")
# --- resize requests (fleet/api/requests.py) ---
router.register("resize-requests", requests_api.ResizeRequestViewSet, basename="resizerequest")
# --- notifications (fleet/api/notifications.py) ---
router.register("notifications", notifications_api.NotificationViewSet, basename="notification")
# --- audit log (fleet/api/audit.py) ---
router.register("audit-events", audit_api.AuditEventViewSet, basename="auditevent")
# --- API tokens (fleet/api/tokens.py) ---
router.register("api-tokens", tokens_api.ApiTokenViewSet, basename="apitoken")

# /api/v1/gpus/ and the GPUs' scheduler routes are served by telemetry/api/urls.py: the GPU's
# detail reads its newest sample, and a policy is applied through the host's agent.
urlpatterns = router.urls
