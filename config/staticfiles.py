"""A static files finder for JavaScript libraries that ship inside Python packages.

plotly.js is part of the plotly wheel we already pin; serving that file (as
`vendor/plotly.min.js`) keeps the dashboard offline-capable without a second, hand-copied
copy of the library in the repository that could drift from the pinned version.
`collectstatic` and whitenoise see it like any other static file.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from django.contrib.staticfiles.finders import BaseFinder
from django.core.files.storage import FileSystemStorage

PREFIX = "vendor"
#: File name under `vendor/` -> (package, file inside the package); the name is the file's own.
PACKAGE_FILES = {
    "plotly.min.js": ("plotly", "package_data/plotly.min.js"),
}


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise LookupError(f"package {package!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


class PackageFileFinder(BaseFinder):
    """Finds `vendor/<name>` in the installed package that ships it."""

    def _files(self) -> dict[str, Path]:
        return {name: _package_dir(package) / inner for name, (package, inner) in PACKAGE_FILES.items()}

    def check(self, **kwargs):
        from django.core.checks import Error

        errors = []
        for name, path in self._files().items():
            if not path.is_file():
                errors.append(Error(f"{PREFIX}/{name}: {path} is missing; reinstall requirements.txt",
                                    id="config.E001"))
        return errors

    def find(self, path: str, find_all: bool = False, **kwargs):
        prefix = f"{PREFIX}/"
        if path.startswith(prefix):
            found = self._files().get(path[len(prefix):])
            if found is not None and found.is_file():
                return [str(found)] if find_all else str(found)
        return [] if find_all else None

    def list(self, ignore_patterns):
        for path in self._files().values():
            storage = FileSystemStorage(location=str(path.parent))
            storage.prefix = PREFIX
            yield path.name, storage
