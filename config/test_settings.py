"""Settings of the test suite (pyproject's DJANGO_SETTINGS_MODULE): config.settings with DEBUG=true.

DEBUG is off unless the environment says otherwise (config/settings.py), and then the settings
demand a real SECRET_KEY, redirect plain http to https, send secure-only cookies and serve static
files from collectstatic's manifest: the test client's plain http requests and the pages' static
files would all fail. So the suite runs with development's settings, as `make run` does;
pytest-django still sets settings.DEBUG to False while the tests run, so error handling is
production's. Production's own settings are tested in subprocesses
(tests/test_deploy_settings.py) and by the fault tests, whose processes run with DEBUG off
(faults/settings.py).

The variable, not a DEBUG = True below, because config.settings derives other settings from it
as it is imported; processes the tests start (workers, agents, `manage.py`) inherit it. An
explicit DEBUG in the environment wins.
"""

import os

os.environ.setdefault("DEBUG", "true")

from config.settings import *  # noqa: E402, F403

# A `replica` alias mirroring the test database (TEST MIRROR: no database of its own), so that the
# router's tests (tests/test_db_router.py) can send a page's reads to it and see them there.
# Routing to it stays off (DATABASE_READ_REPLICA None) unless a test turns it on: a mirror is a
# second connection, which does not see the rows a test writes inside its own transaction.
# PostgreSQL only: on SQLite a mirror is a second connection to the same file, which closes and
# locks the first one's in transactional tests (and replicas need DATABASE_URL anyway).
if DATABASES["default"]["ENGINE"].endswith("postgresql"):  # noqa: F405
    DATABASES["replica"] = {**DATABASES["default"], "TEST": {**DATABASES["default"].get("TEST", {}),  # noqa: F405
                                                              "MIRROR": "default"}}
DATABASE_READ_REPLICA = None
