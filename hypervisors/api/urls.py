"""Routes of the v1 hypervisors API, mounted at /api/v1/."""

from config.routers import AppRouter
from hypervisors.api.operations import OperationViewSet

router = AppRouter()
# --- operations (hypervisors/api/operations.py) ---
router.register("operations", OperationViewSet, basename="operation")

urlpatterns = [*router.urls]
