"""Routes of the v1 hypervisors API, mounted at /api/v1/ after the other apps' (config/urls.py):
the operations and drift resources, and addresses under hosts/{id}/, a resource fleet owns and this app adds to."""

from django.urls import path

from config.routers import AppRouter
from hypervisors.api import views
from hypervisors.api.drift import DriftViewSet
from hypervisors.api.operations import OperationViewSet

router = AppRouter()
# --- operations (hypervisors/api/operations.py) ---
router.register("operations", OperationViewSet, basename="operation")
# --- drift between inventory, hypervisors and agents (hypervisors/api/drift.py) ---
router.register("drift", DriftViewSet, basename="drift")

urlpatterns = [
    path("hosts/<int:pk>/hypervisor/", views.HostHypervisorView.as_view(), name="host-hypervisor"),
    path("hosts/<int:pk>/hypervisor/check/", views.HostHypervisorCheckView.as_view(), name="host-hypervisor-check"),
    path("hosts/<int:pk>/sync/", views.HostSyncView.as_view(), name="host-sync"),
    *router.urls,
]
