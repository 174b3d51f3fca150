from django.apps import AppConfig


class SizingConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "sizing"
