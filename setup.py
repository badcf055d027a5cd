"""Package discovery for the folder-to-subpackage mapping in pyproject.toml.

The four code folders sit at the top of the repository (``node/``, ``storage/``, ...) but install
as ``cnode.node``, ``cnode.storage``, ...; setuptools cannot discover subpackages under such a
mapping on its own, so they are listed here, found by walking each folder.
"""

from setuptools import find_packages, setup

_FOLDERS = ("node", "storage", "aggregation", "auth")

packages = ["cnode"]
for folder in _FOLDERS:
    packages.append(f"cnode.{folder}")
    packages.extend(f"cnode.{folder}.{sub}" for sub in find_packages(where=folder))

setup(packages=packages)
