"""The installed layout: every package is listed in pyproject.toml, and the zoo is jaxmove.zoo."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_every_package_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "jaxmove").rglob("__init__.py")}
    on_disk |= {"jaxmove.zoo"}  # models/ is installed under this name
    on_disk |= {"jaxmove.hardware.specs"}  # data only: the spec .toml files (setuptools wants it listed)
    assert any((ROOT / "jaxmove" / "hardware" / "specs").glob("*.toml"))
    assert on_disk - listed == set(), f"packages missing from pyproject.toml [tool.setuptools] packages: {sorted(on_disk - listed)}"
    assert listed - on_disk == set(), f"pyproject.toml lists packages that do not exist: {sorted(listed - on_disk)}"


def test_zoo_is_jaxmove_zoo_and_models_is_not_installed(tmp_path):
    # From a directory without the checkout on sys.path, a user's `models` is not ours.
    code = ("import importlib.util, jaxmove.zoo as z; "
            "assert 'gpt2-small-decode' in dict(z.list_presets()); "
            "print(importlib.util.find_spec('models'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env={"PATH": "", "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "None"
