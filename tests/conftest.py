"""Fixtures of the CPU suite: the built wheels, fresh virtual environments, and a stand-in
libcuda.so.1 compiled from tests/stubs/libcuda_stub.c."""

from __future__ import annotations

import glob
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import release  # noqa: E402, F401  (for the tests: the backends, CPythons, archs and runtime pins of a release)

DIST = Path(os.environ.get("CULA_TEST_DIST", ROOT / "dist"))
# The interpreter the wheels were built for (make passes it); fresh venvs are made from it.
BUILD_PYTHON = os.environ.get("CULA_TEST_PYTHON", sys.executable)
VERSION = (ROOT / "VERSION").read_text().strip()
STUB_RELEASE = "575.57.08"


def build_requires(pkg: str) -> list[str]:
    """The build-system requirements of packages/<pkg>/pyproject.toml."""
    import tomllib

    return tomllib.loads((ROOT / "packages" / pkg / "pyproject.toml").read_text())["build-system"]["requires"]


def _python_tag(python: str) -> str:
    out = subprocess.run([python, "-c", "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.fixture(scope="session")
def wheels() -> dict[str, Path]:
    tag = _python_tag(BUILD_PYTHON)
    found = {}
    for key, pattern in (("cula", f"cula-{VERSION}-py3-none-any.whl"),
                         ("cu12", f"cula_cu12-{VERSION}-{tag}-{tag}-*_{platform.machine()}.whl"),
                         ("cu13", f"cula_cu13-{VERSION}-{tag}-{tag}-*_{platform.machine()}.whl")):
        matches = sorted(glob.glob(str(DIST / pattern)))
        if not matches:
            pytest.fail(f"{pattern} not in {DIST}: run `make wheels` first")
        found[key] = Path(matches[-1])
    return found


class Venv:
    """A fresh virtual environment made from BUILD_PYTHON (or another interpreter)."""

    def __init__(self, path: Path, python: str = BUILD_PYTHON):
        self.path = path
        subprocess.run([python, "-m", "venv", str(path)], check=True)
        self.python = str(path / "bin" / "python")

    def pip(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([self.python, "-m", "pip", "--disable-pip-version-check", "install", "-q",
                               "--find-links", str(DIST), *args], capture_output=True, text=True, check=check)

    def run(self, code: str, env: dict | None = None, args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("CULA_", "PYTHON"))}
        full_env.update(env or {})
        cmd = [self.python, *args] if args else [self.python, "-c", code]
        return subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=300)

    @property
    def site_packages(self) -> Path:
        out = subprocess.run([self.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True)
        return Path(out.stdout.strip())


@pytest.fixture
def make_venv(tmp_path):
    def make(name: str = "venv") -> Venv:
        return Venv(tmp_path / name)
    return make


@pytest.fixture(scope="session")
def stub_libcuda(tmp_path_factory) -> Path:
    """Directory holding the compiled stand-in libcuda.so.1 (put it on LD_LIBRARY_PATH)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("a C compiler is needed to build the stand-in libcuda.so.1")
    out = tmp_path_factory.mktemp("stub")
    # Named like the real driver's file (libcuda.so.1 -> libcuda.so.<release>), where the probe
    # reads the release number when /proc/driver/nvidia/version is absent.
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wl,-soname,libcuda.so.1", "-o",
                    str(out / f"libcuda.so.{STUB_RELEASE}"), str(ROOT / "tests" / "stubs" / "libcuda_stub.c")],
                   check=True)
    (out / "libcuda.so.1").symlink_to(f"libcuda.so.{STUB_RELEASE}")
    return out


def stub_env(stub_dir: Path, driver: int | None = 13000, gpus: str = "NVIDIA H200:9.0", init_error: int = 0,
             **extra: str) -> dict[str, str]:
    env = {"LD_LIBRARY_PATH": str(stub_dir), "CULA_STUB_GPUS": gpus, "CULA_STUB_INIT_ERROR": str(init_error)}
    if driver is not None:
        env["CULA_STUB_DRIVER_VERSION"] = str(driver)
    env.update(extra)
    return env


def ext_suffix() -> str:
    return sysconfig.get_config_var("EXT_SUFFIX")


@pytest.fixture(scope="session")
def selector(tmp_path_factory, wheels) -> Venv:
    """A venv with the cula selector only (no backend)."""
    v = Venv(tmp_path_factory.mktemp("selector") / "venv")
    v.pip(str(wheels["cula"]))
    return v
