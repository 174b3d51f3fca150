"""`make test` runs every app's tests and measures every app: a new app left out of pytest's
testpaths or coverage's sources would have its tests silently never run in CI."""

import tomllib
from pathlib import Path

from django.apps import apps
from django.conf import settings

ROOT = Path(settings.BASE_DIR)


def project_apps() -> set[str]:
    return {config.name for config in apps.get_app_configs() if Path(config.path).parent == ROOT}


def test_every_app_of_the_project_is_tested_and_measured():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    testpaths = set(config["tool"]["pytest"]["ini_options"]["testpaths"])
    sources = set(config["tool"]["coverage"]["run"]["source"])
    with_tests = {name for name in project_apps() if (ROOT / name / "tests").is_dir()}
    assert with_tests - testpaths == set(), "apps whose tests `make test` never runs"
    assert project_apps() - sources == set(), "apps coverage does not measure"
    assert {"alerts", "notify"} <= with_tests
