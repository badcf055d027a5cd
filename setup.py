"""Package discovery for the folder-to-subpackage mapping in pyproject.toml.

The four code folders sit at the top of the repository (``node/``, ``storage/``, ...) but install
as ``cnode.node``, ``cnode.storage``, ...; setuptools cannot discover subpackages under such a
mapping on its own, so they are listed here, found by walking each folder.
Data folders (no ``__init__.py``) are named in ``_DATA_PACKAGES`` so that their files ship in the
wheel; tests/test_packaging.py builds one and checks.
"""

from setuptools import find_packages, setup

_FOLDERS = ("node", "storage", "aggregation", "auth")
# Folders of data files, not code: their files are package data (see pyproject.toml).
_DATA_PACKAGES = ("cnode.node.train.data", "cnode.node.coordinator.static")

packages = ["cnode"]
for folder in _FOLDERS:
    packages.append(f"cnode.{folder}")
    packages.extend(f"cnode.{folder}.{sub}" for sub in find_packages(where=folder))

packages.extend(_DATA_PACKAGES)

setup(packages=packages)
