from django.apps import AppConfig


class DashboardConfig(AppConfig):
    """The server-rendered pages: the app on top, reading fleet, telemetry and sizing through
    their queries and services. It owns no models."""

    name = "dashboard"
    verbose_name = "Dashboard"
