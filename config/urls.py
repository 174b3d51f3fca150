"""URL map: the dashboard's pages, login (and OpenID Connect's, when configured), the admin site,
the v1 REST API with its schema and docs, the health check and the Prometheus exposition."""

import logging

from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.db import connection
from django.http import JsonResponse
from django.urls import include, path
from django.views.decorators.cache import never_cache
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from alerts.api import urls as alerts_api
from config.api.root import root_view
from fleet.api import urls as fleet_api
from hypervisors.api import urls as hypervisors_api
from identity.views import SignInView
from notify.api import urls as notify_api
from sizing.api import urls as sizing_api
from telemetry.api import urls as telemetry_api
from telemetry.exposition import metrics_view

logger = logging.getLogger(__name__)


@never_cache
def healthz(request):
    """Liveness and database reachability for load balancers; needs no login.

    Anyone may call it, so a failure answers only "unreachable": the driver's message names
    the database's host, port and user. The message goes to the log for the operator (drivers
    leave the password out of it).
    """
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - any database failure means unhealthy
        logger.warning("healthz: database unreachable (%s: %s)", type(exc).__name__, exc)
        return JsonResponse({"status": "error", "database": "unreachable"}, status=503)
    return JsonResponse({"status": "ok"})


# The v1 API comes first: scripts polling its lists send most of the requests, and Django tries
# the patterns in order (the dashboard's ~70 pages, all failing on an /api/v1/ path). No page
# lives under api/, so the order changes no answer.
api_v1_patterns = [
    path("", root_view(
        (fleet_api.router, telemetry_api.router, hypervisors_api.router, sizing_api.router, notify_api.router,
         alerts_api.router),
        views={"heatmap": "heatmap-api", "sizing-plan": "sizing-plan", "ingest-nvidia-smi": "ingest-nvidia-smi",
               "licences": "licences-api"},
        templates={"gpu-metrics": "/api/v1/gpus/{id}/metrics/", "vm-metrics": "/api/v1/vms/{id}/metrics/",
                   "gpu-scheduler": "/api/v1/gpus/{id}/scheduler/",
                   "gpu-scheduler-apply": "/api/v1/gpus/{id}/scheduler/apply/",
                   "host-scheduler-default": "/api/v1/hosts/{id}/scheduler/",
                   "gpu-model-scheduler-default": "/api/v1/gpu-models/{id}/scheduler/",
                   "host-hypervisor": "/api/v1/hosts/{id}/hypervisor/",
                   "host-hypervisor-check": "/api/v1/hosts/{id}/hypervisor/check/",
                   "host-sync": "/api/v1/hosts/{id}/sync/",
                   "host-driver": "/api/v1/hosts/{id}/driver/"},
    ), name="api-root"),
    # The apps' routes in one flat list, in the order they were included: a nested include that
    # does not hold the path fails with the list of every pattern it tried, built on each request.
    *fleet_api.urlpatterns,
    *telemetry_api.urlpatterns,
    *sizing_api.urlpatterns,
    *hypervisors_api.urlpatterns,
    *notify_api.urlpatterns,
    *alerts_api.urlpatterns,
]

urlpatterns = [
    path("api/v1/", include(api_v1_patterns)),
    path("", include("dashboard.urls")),
    path("login/", SignInView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),
]

if settings.OIDC_ENABLED:
    # Signing in with the studio's OpenID Connect provider (identity/oidc.py, config/settings.py).
    urlpatterns.append(path("oidc/", include("mozilla_django_oidc.urls")))

# Under /api/ a path no route matches (and Django's own 400 and 500) answers JSON (config/api/__init__.py).
handler400 = "config.api.bad_request"
handler404 = "config.api.page_not_found"
handler500 = "config.api.server_error"
