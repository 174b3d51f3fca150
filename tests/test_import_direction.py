"""The direction of imports (.importlinter, run by `make lint`): an import against it fails the
build, naming the module that broke it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("config", "fleet", "identity", "notify", "telemetry", "hypervisors", "sizing", "alerts", "dashboard")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=cwd, capture_output=True, text=True,
                          timeout=300, check=False)


@pytest.fixture
def tree(tmp_path) -> Path:
    """A copy of the project's packages (Python files only) and its import contracts."""
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("*.pyc", "__pycache__", "fixtures", "*.html", "*.json"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    return tmp_path


def test_the_code_keeps_the_direction():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(("module", "line", "broken"), [
    # the inventory reading telemetry: fleet sits below it
    ("fleet/capacity.py", "from telemetry import queries as _queries", "fleet is not allowed to import telemetry"),
    # a domain app reaching up into the pages
    ("sizing/engine.py", "from dashboard.views import lists as _lists", "sizing is not allowed to import dashboard"),
    # an app's core importing its own API layer
    ("telemetry/heatmap.py", "from telemetry.api import metrics as _api", "Illegal imports of protected package"),
    # a circle inside one app
    ("telemetry/rollup_tasks.py", "from telemetry import schedules as _schedules", None),
])
def test_an_import_against_the_direction_fails_the_build(tree, module, line, broken):
    path = tree / module
    path.write_text(path.read_text() + f"\n{line}  # noqa\n")
    if broken is None:  # make the circle: schedules imports rollup_tasks back
        schedules = tree / "telemetry/schedules.py"
        schedules.write_text(schedules.read_text() + "\nfrom telemetry import rollup_tasks as _rollup_tasks  # noqa\n")
        broken = "No import cycles"
    result = lint_imports(tree)
    assert result.returncode != 0
    assert broken in result.stdout, result.stdout
