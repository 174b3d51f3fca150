# One image for web, worker, beat, migrate and the simulated agent; the command differs per
# service (docker-compose.yml). Runs as an unprivileged user; the code is root-owned, read-only
# to it.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY requirements.txt .
RUN pip install -r requirements.txt
COPY . .
# Collected with the production storage (DEBUG off): whitenoise serves these compressed, with
# hashed names from the manifest. The key only lets settings load here; it is not kept.
RUN DEBUG=false SECRET_KEY=collectstatic-only-not-a-secret python manage.py collectstatic --noinput
RUN useradd --system --uid 10001 --no-create-home fleet && mkdir -p /app/var/secrets /app/var/sim-hypervisors /agents \
    && chown fleet /app/var /app/var/secrets /app/var/sim-hypervisors /agents
USER fleet
EXPOSE 8000
CMD ["gunicorn", "config.wsgi:application", "--config", "config/gunicorn.conf.py"]
