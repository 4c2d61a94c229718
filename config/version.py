"""The platform's one version number: the package's (``pyproject.toml``), which the API
schema (``SPECTACULAR_SETTINGS``), the image tag (``platform/k8s``) and CHANGELOG.md carry
too (``tests/config/test_version.py`` holds them together)."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "kvinject-platform"


def _version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # a checkout run without `pip install -e .`
        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        return tomllib.loads(pyproject.read_text())["project"]["version"]


VERSION = _version()
