"""The package list, beside pyproject.toml (which has the rest): every ``jaxembed*`` package, and the recipes --
``configs/`` of the repository -- shipped as the package ``jaxembed.recipes``, so that an installed jaxembed finds
them by name (``--config demo:tiny``, ``jaxembed.paths.recipes_dir``). In pyproject.toml, package discovery finds a
package only in a folder of its own name, and a list written out by hand would miss new packages: hence this file."""

from setuptools import find_packages, setup

setup(packages=find_packages(include=["jaxembed", "jaxembed.*"]) + ["jaxembed.recipes"],
      package_dir={"jaxembed.recipes": "configs"})
