# One image for web, worker, beat, migrate and the simulated agent; the command differs per
# service (docker-compose.yml). Runs as an unprivileged user; the code is root-owned, read-only
# to it.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY requirements.txt requirements-ldap.txt ./
# LDAP / Active Directory sign-in: python-ldap is built against OpenLDAP's development files, which
# are removed again after the build; the runtime libraries stay.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libldap2-dev libsasl2-dev \
    && pip install -r requirements.txt -r requirements-ldap.txt \
    && apt-get purge -y --auto-remove gcc libldap2-dev libsasl2-dev \
    && apt-get install -y --no-install-recommends libldap-2.5-0 libsasl2-2 && rm -rf /var/lib/apt/lists/*
COPY . .
# Collected with the production storage (DEBUG off): whitenoise serves these compressed, with
# hashed names from the manifest. The key only lets settings load here; it is not kept.
RUN DEBUG=false SECRET_KEY=collectstatic-only-not-a-secret python manage.py collectstatic --noinput
RUN useradd --system --uid 10001 --no-create-home fleet && mkdir -p /app/var/secrets /app/var/sim-hypervisors /agents \
    && chown fleet /app/var /app/var/secrets /app/var/sim-hypervisors /agents
USER fleet
EXPOSE 8000
CMD ["gunicorn", "config.wsgi:application", "--config", "config/gunicorn.conf.py"]
