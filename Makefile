# The two commands of the README: `make run` and `make test`. Both need only Python 3.11+.
#
# DEBUG is off unless set (config/settings.py): the development targets below set DEBUG=true,
# so the demo serves plain http on 127.0.0.1 with a development secret. The tests set it
# themselves (config/test_settings.py).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
# The demo's simulated agents listen on consecutive ports from this one, one per demo host.
AGENT_PORT ?= 9411

.PHONY: run test test-fast test-slow lint check install install-libvirt install-ldap serve clean audit screenshots

# The virtualenv is rebuilt whenever a requirements file changes.
$(VENV)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $@

install: $(VENV)/.installed

# Optional: the libvirt/KVM hypervisor link (hypervisors/backends/libvirt.py). libvirt-python is
# built from source against the host's libvirt: it needs libvirt-dev, pkg-config and a C compiler
# (apt-get install libvirt-dev pkg-config gcc). `make install` leaves it out, so a machine with
# only Python runs the product (the libvirt tests then skip and say why).
install-libvirt: $(VENV)/.installed-libvirt

$(VENV)/.installed-libvirt: requirements-libvirt.txt | $(VENV)/.installed
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-libvirt.txt
	touch $@

# Optional: signing in with the studio's LDAP / Active Directory (identity/ldap_backend.py).
# python-ldap is built from source against OpenLDAP: it needs libldap2-dev, libsasl2-dev and a C
# compiler. Without it the product signs people in with local accounts (and OpenID Connect), and
# setting AUTH_LDAP_SERVER_URI stops start-up with a message saying to run this.
install-ldap: $(VENV)/.installed-ldap

$(VENV)/.installed-ldap: requirements-ldap.txt | $(VENV)/.installed
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-ldap.txt
	touch $@

# The demo logins are generated once and kept in var/ (ignored by git), so every `make run`
# prints the same working passwords; DEMO_ADMIN_PASSWORD / DEMO_ARTIST_PASSWORD override them.
DEMO_SECRETS := var/demo-admin-password var/demo-artist-password

$(DEMO_SECRETS): | $(VENV)/.installed
	mkdir -p var
	$(BIN)/python -c "import secrets; print(secrets.token_urlsafe(12))" > $@
	chmod 600 $@

run serve lint: export DEBUG = true

run: install $(DEMO_SECRETS)
	$(BIN)/python manage.py migrate --noinput
	DEMO_ADMIN_PASSWORD="$${DEMO_ADMIN_PASSWORD:-$$(cat var/demo-admin-password)}" \
	DEMO_ARTIST_PASSWORD="$${DEMO_ARTIST_PASSWORD:-$$(cat var/demo-artist-password)}" \
	$(BIN)/python manage.py seed_demo
	$(BIN)/python manage.py demo_alerts
	$(BIN)/python manage.py demo_hypervisors
	$(BIN)/python manage.py hypervisor_sync
	$(BIN)/python manage.py demo_agents --base-port $(AGENT_PORT)
	@echo "Back-filling two weeks of demo history for every demo host (first run only, a minute or two)..."
	$(BIN)/python manage.py backfill_demo
	$(BIN)/python manage.py demo_feedback
	$(BIN)/python manage.py refresh_suggestions
	@echo "Serving http://$(HOST):$(PORT)/  (admin site: http://$(HOST):$(PORT)/admin/, API: /api/v1/, docs: /api/docs/)"
	@echo "Starting a simulated agent per demo host (one process), a Celery worker, beat and the web server; Ctrl-C stops them all."
	$(BIN)/python manage.py runfleet $(HOST):$(PORT)

# The web server alone (no worker, beat or agents: nothing is collected).
serve: install
	$(BIN)/python manage.py runserver $(HOST):$(PORT)

# The suite in two tiers (conftest.py): `slow` (tests that start services of their own: faults/,
# e2e/, a real worker; subprocesses; generated cases) and the rest. `make test` runs both tiers
# together in parallel worker processes (pytest-xdist, one per core unless PYTEST_WORKERS says),
# and measures coverage against the floor in pyproject.toml; `make test-fast` is the quick check
# while developing. pytest exits non-zero on a failure and when no test ran (exit code 5).
PYTEST_WORKERS ?= auto
PYTEST_PARALLEL = -n $(PYTEST_WORKERS) --dist loadgroup

test: install
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) --cov --cov-report=term $(PYTEST_ARGS)

test-fast: install
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) -m "not slow" $(PYTEST_ARGS)

test-slow: install
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) -m slow $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/python manage.py makemigrations --check --dry-run

check: lint test

# The browser tests, keeping what they photograph: every page at 375, 1280 and 1920 px
# (e2e/test_layout.py) and the steps of the other browser tests, into docs/screenshots/.
screenshots: install
	SCREENSHOT_DIR=docs/screenshots $(BIN)/python -m pytest e2e $(PYTEST_ARGS)

# Known vulnerabilities in the pinned set (PyPI's advisory service, through pip-audit in a
# virtualenv of its own). --strict: a package it could not look up is a failure, never a pass.
AUDIT_VENV ?= .venv-audit
audit:
	$(PYTHON) -m venv $(AUDIT_VENV)
	$(AUDIT_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-audit.txt
	$(AUDIT_VENV)/bin/pip-audit --strict --progress-spinner off -r requirements.txt -r requirements-dev.txt

clean:
	rm -rf $(VENV) $(AUDIT_VENV) db.sqlite3 .test-db.sqlite3* var staticfiles .pytest_cache .ruff_cache .coverage .coverage.*
