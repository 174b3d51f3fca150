# The two commands of the README: `make run` and `make test`. Both need only Python 3.11+.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: run test lint check install serve clean

# The virtualenv is rebuilt whenever a requirements file changes.
$(VENV)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $@

install: $(VENV)/.installed

run: install
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py seed_demo
	@echo "Serving http://$(HOST):$(PORT)/  (admin site: http://$(HOST):$(PORT)/admin/, API: /api/v1/, docs: /api/docs/)"
	$(BIN)/python manage.py runserver $(HOST):$(PORT)

test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/python manage.py makemigrations --check --dry-run

check: lint test

clean:
	rm -rf $(VENV) db.sqlite3 .test-db.sqlite3 var staticfiles .pytest_cache .ruff_cache
