from django.contrib.auth import views as auth_views
from django.urls import include, path

from identity.tests.oidc_provider import views

urlpatterns = [
    path("o/", include("oauth2_provider.urls", namespace="oauth2_provider")),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("testing/users/<str:username>", views.put_user, name="put-user"),
]
