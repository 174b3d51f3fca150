"""Routes of the v1 alerts API, mounted at /api/v1/ (config/urls.py)."""

from django.urls import path

from alerts.api import views
from config.routers import AppRouter

router = AppRouter()
router.register("alerts", views.AlertViewSet, basename="alert")
router.register("alert-rules", views.AlertRuleViewSet, basename="alert-rule")
router.register("silences", views.SilenceViewSet, basename="silence")
router.register("licence-pools", views.LicencePoolViewSet, basename="licence-pool")

urlpatterns = [
    path("licences/", views.LicencesView.as_view(), name="licences-api"),
    *router.urls,
]
