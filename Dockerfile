# One image for web, worker, beat and migrate; the command differs per service.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY requirements.txt .
RUN pip install -r requirements.txt
COPY . .
RUN DEBUG=true python manage.py collectstatic --noinput
RUN useradd --system --uid 10001 fleet && mkdir -p /app/var /agents && chown fleet /app/var /agents
USER fleet
EXPOSE 8000
CMD ["gunicorn", "config.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "3", "--access-logfile", "-"]
