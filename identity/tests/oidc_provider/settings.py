"""Settings of the test OpenID Connect provider (package docstring). Its database and the token
that guards its user management come from the environment (`__main__` sets them); the RSA key
that signs its ID tokens is made when the process starts."""

import os
import secrets
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

HERE = Path(__file__).resolve().parent


def new_rsa_key() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


SECRET_KEY = secrets.token_urlsafe(50)
DEBUG = False
# Served as `localhost` while the dashboard's test server is 127.0.0.1: two hosts, so neither
# site's cookies reach the other (and they have names of their own besides).
ALLOWED_HOSTS = ["localhost"]
SESSION_COOKIE_NAME = "provider_sessionid"
CSRF_COOKIE_NAME = "provider_csrftoken"

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "oauth2_provider",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
ROOT_URLCONF = "identity.tests.oidc_provider.urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "DIRS": [HERE / "templates"],
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": ["django.template.context_processors.request"]},
}]
# A throwaway database: tables made straight from the models (no migrations to replay) and no
# waiting for the disk, so the provider is up in a second or two.
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["OIDC_PROVIDER_DB"],
                         "OPTIONS": {"init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=OFF;"}}}
MIGRATION_MODULES = {app.rsplit(".", 1)[-1]: None for app in INSTALLED_APPS}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # test users only
USE_TZ = True
LOGIN_URL = "/accounts/login/"

#: The bearer token of the user management endpoint (views.put_user).
ADMIN_TOKEN = os.environ["OIDC_PROVIDER_ADMIN_TOKEN"]

OAUTH2_PROVIDER = {
    "OIDC_ENABLED": True,
    "OIDC_RSA_PRIVATE_KEY": new_rsa_key(),
    "OAUTH2_VALIDATOR_CLASS": "identity.tests.oidc_provider.validator.ClaimsValidator",
    "SCOPES": {"openid": "OpenID Connect", "profile": "Your name and user name", "email": "Your e-mail address",
               "groups": "Your groups"},
    "PKCE_REQUIRED": True,
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["stderr"], "level": "INFO"},
}
