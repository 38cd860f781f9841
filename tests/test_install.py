"""Fresh virtual environments with the built wheels (NVIDIA's runtime wheels come from PyPI):
what `import cula` says, which backend is chosen, and which libcudart file gets loaded."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import zipfile

import pytest
from conftest import BUILD_PYTHON, ROOT, VERSION, release, stub_env

REPORT = """
import json, os, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import cula
out = {"warnings": [f"{w.category.__name__}: {w.message}" for w in caught]}
try:
    from cula import _loader
    b = _loader.backend()
    path = os.path.realpath(b.module.runtime_library_path())
    maps = open("/proc/self/maps").read()
    out.update(backend=b.name, reason=b.reason, found_via=b.runtime_found_via, cudart=path,
               mapped=path in maps, runtime=b.module.runtime_version())
except cula.BackendError as exc:
    out["error"] = str(exc)
try:
    cula.chunk_simple_gla(None, None, None)
except Exception as exc:
    out["op_error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def report(venv, **env) -> dict:
    out = venv.run(REPORT, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_selector_only_warns_once_with_the_command(make_venv, wheels, stub_libcuda):
    v = make_venv()
    v.pip(str(wheels["cula"]))
    r = report(v)  # no driver at all on this machine
    assert len(r["warnings"]) == 1 and r["warnings"][0].startswith("CulaBackendWarning: cula: no CUDA backend")
    assert "No NVIDIA driver found" in r["warnings"][0]
    assert f'Run: pip install "cula[cu13]=={VERSION}"' in r["warnings"][0]
    assert r["op_error"] == "BackendError: " + r["error"] and r["error"] in r["warnings"][0]
    # With a CUDA 12 driver and an H200 the command is the cu12 one, and it says what it saw.
    r = report(v, **stub_env(stub_libcuda, driver=12080))
    assert ("Driver 575.57.08 (CUDA 12.8); GPU 0 NVIDIA H200 (sm_90, supported). "
            f'Run: pip install "cula[cu12]=={VERSION}"') in r["warnings"][0]
    out = v.run("", args=("-m", "cula"), env=stub_env(stub_libcuda, driver=13000, gpus="NVIDIA B200:10.0"))
    assert out.returncode == 0, out.stderr
    assert "NVIDIA B200, compute capability 10.0, supported (sm_100f kernels)" in out.stdout
    assert f'pip install "cula[cu13]=={VERSION}"' in out.stdout and "none usable" in out.stdout
    # Uninstalling a backend goes back to the probe warning.
    v.pip(str(wheels["cu12"]))
    assert report(v)["warnings"] == [] and report(v)["backend"] == "cu12"
    subprocess.run([v.python, "-m", "pip", "uninstall", "-y", "-q", "cula-cu12"], check=True)
    assert report(v)["warnings"][0].startswith("CulaBackendWarning: cula: no CUDA backend")


@pytest.mark.parametrize("name, wheel_dir", [("cu12", "nvidia/cuda_runtime/lib"), ("cu13", "nvidia/cu13/lib")])
def test_backend_loads_the_wheels_libcudart(make_venv, wheels, name, wheel_dir):
    """The RUNPATH finds the runtime wheel's libcudart; /proc/self/maps shows that very file
    (this machine also has a system libcudart.so.13 in the loader cache)."""
    v = make_venv()
    v.pip(f"cula[{name}]")
    r = report(v)
    assert r["warnings"] == [] and r["backend"] == name
    assert r["cudart"] == os.path.realpath(v.site_packages / wheel_dir / f"libcudart.so.{name[2:]}")
    assert r["mapped"] and r["found_via"].startswith("RUNPATH")
    assert r["op_error"].startswith("TypeError: cula: q must be a CUDA array")
    out = v.run("", args=("-m", "cula"))
    assert out.returncode == 0 and f"backend         cula-{name} {VERSION}" in out.stdout
    check = v.run("", args=(str(ROOT / "tests" / "check_installed.py"),))  # the release workflow's wheel test
    assert check.returncode == 0 and check.stdout.startswith(f"cula-{name} {VERSION} on Python"), check.stderr


def test_both_backends_choice(make_venv, wheels, stub_libcuda):
    v = make_venv()
    v.pip("cula[cu12,cu13]")
    r = report(v, **stub_env(stub_libcuda, driver=12080))
    assert (r["backend"], r["reason"]) == ("cu12", "driver supports CUDA 12.8")
    r = report(v, **stub_env(stub_libcuda, driver=13000))
    assert (r["backend"], r["reason"]) == ("cu13", "driver supports CUDA 13.0")
    assert report(v)["backend"] == "cu13"  # no driver: newest first
    r = report(v, CULA_BACKEND="cu12", **stub_env(stub_libcuda, driver=13000))
    assert (r["backend"], r["reason"]) == ("cu12", "CULA_BACKEND")
    # An installed PyTorch built for CUDA 12 wins on a CUDA 13 driver (one libcudart major per
    # process). A stand-in torch package: the loader reads torch/version.py without importing torch.
    torch_dir = v.site_packages / "torch"
    torch_dir.mkdir()
    (torch_dir / "__init__.py").write_text("raise ImportError('stand-in torch: cula must not import it')\n")
    (torch_dir / "version.py").write_text("__version__ = '2.9.0'\ncuda: Optional[str] = '12.8'\n")
    r = report(v, **stub_env(stub_libcuda, driver=13000))
    assert (r["backend"], r["reason"]) == ("cu12", "matches PyTorch's CUDA 12")
    shutil.rmtree(torch_dir)
    r = report(v, CULA_BACKEND="cu11")
    assert "CULA_BACKEND='cu11' is not valid; expected one of cu13, cu12" in r["error"]
    assert r["warnings"] and r["op_error"].startswith("BackendError")


def test_forced_backend_not_installed(make_venv, wheels):
    v = make_venv()
    v.pip("cula[cu13]")
    r = report(v, CULA_BACKEND="cu12")
    assert r["error"] == ("cula: CULA_BACKEND=cu12 but cula-cu12 is not installed. "
                          f'Run: pip install "cula[cu12]=={VERSION}"')


def test_no_deps_backend_without_runtime(make_venv, wheels):
    v = make_venv()
    v.pip("--no-deps", str(wheels["cula"]), str(wheels["cu12"]))
    r = report(v)
    assert "error" in r, r
    assert "cula-cu12 needs libcudart.so.12, and none was found" in r["error"]
    assert 'pip install "nvidia-cuda-runtime-cu12>=12"' in r["error"]
    assert r["op_error"] == "BackendError: " + r["error"]


def test_no_deps_backend_falls_back_to_other_runtimes(make_venv, wheels, tmp_path):
    """Without the runtime wheel, a libcudart.so.12 found elsewhere (here: CUDA_HOME) is used,
    and the report says which file."""
    v = make_venv()
    v.pip("--no-deps", str(wheels["cula"]), str(wheels["cu12"]))
    v.pip("--target", str(tmp_path / "rt"), "nvidia-cuda-runtime-cu12==12.9.79")
    home = tmp_path / "cuda"
    (home / "lib64").mkdir(parents=True)
    shutil.copy(tmp_path / "rt" / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12", home / "lib64")
    r = report(v, CUDA_HOME=str(home))
    assert r["backend"] == "cu12" and r["found_via"] == f"CUDA_HOME: {home}/lib64/libcudart.so.12"
    assert r["cudart"] == str(home / "lib64" / "libcudart.so.12") and r["mapped"]


def test_version_skew(make_venv, wheels, tmp_path):
    """A backend from another release than the selector: one error naming both versions."""
    src = tmp_path / "cula-src"
    shutil.copytree(ROOT / "packages" / "cula", src, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    (src / "VERSION").write_text("0.0.1\n")
    subprocess.run([BUILD_PYTHON, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "old"), str(src)],
                   check=True)
    v = make_venv()
    v.pip("cula[cu12]")
    v.pip("--no-deps", "--force-reinstall", str(next((tmp_path / "old").glob("cula-0.0.1-*.whl"))))
    r = report(v)
    assert f"version skew: cula 0.0.1 but cula-cu12 {VERSION}" in r["error"]
    assert 'pip install "cula[cu12]==0.0.1"' in r["error"]
    assert r["warnings"] and r["op_error"] == "BackendError: " + r["error"]
    r = report(v, CULA_SKIP_CHECKS="1")
    assert r["backend"] == "cu12"
    # Every problem in one error: no runtime and the skew together.
    subprocess.run([v.python, "-m", "pip", "uninstall", "-y", "-q", "nvidia-cuda-runtime-cu12"], check=True)
    r = report(v)
    assert r["error"].startswith("cula: the CUDA backend cannot be used:\n  - cula-cu12 needs libcudart.so.12")
    assert f"\n  - version skew: cula 0.0.1 but cula-cu12 {VERSION}" in r["error"]


RUNTIME_DIST = {name: release.runtime_pin(name).split("==")[0] for name in release.BACKENDS}
INSTALLED_VERSION = "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))"


def runtime_lower_bound(wheel) -> str:
    """The lower bound of the backend wheel's runtime requirement (its METADATA)."""
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    (bound,) = re.findall(r"^Requires-Dist: nvidia-cuda-runtime[\w-]*[<>=,\d.]*>=([\d.]+)", meta, re.M)
    return bound


def cuda_version(version: str) -> int:
    major, minor = version.split(".")[:2]
    return int(major) * 1000 + int(minor) * 10


@pytest.mark.parametrize("name", ["cu12", "cu13"])
def test_lowest_runtime_the_requirement_admits_loads(make_venv, wheels, name):
    """The requirement's lower bound is the oldest release of the runtime wheel on the index, and
    the backend loads it (cula-cu12 needs no libcudart symbol newer than 12.0: driver entry points
    come through cudaGetDriverEntryPoint). The GPU suite runs kernels with it too:
    tests/run.py --gpu --runtime lowest."""
    lowest = runtime_lower_bound(wheels[name])
    older = subprocess.run([BUILD_PYTHON, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d",
                            os.devnull, f"{RUNTIME_DIST[name]}<{lowest}"], capture_output=True, text=True)
    assert older.returncode != 0 and "No matching distribution found" in older.stderr, older.stdout
    v = make_venv()
    v.pip(f"cula[{name}]", f"{RUNTIME_DIST[name]}=={lowest}")
    r = report(v)
    assert r["warnings"] == [] and r["backend"] == name and r["runtime"] == cuda_version(lowest), r


@pytest.mark.parametrize("name", ["cu12", "cu13"])
@pytest.mark.parametrize("torch_cuda", ["cu126", "cu128", "cu129", "cu130"])
def test_backend_next_to_pytorch_runtime_pins(make_venv, wheels, name, torch_cuda):
    """cula[cuNN] with the exact NVIDIA runtime pins of a PyTorch wheel as pip constraints (not
    torch itself): resolves, and loads the pinned libcudart where the majors match."""
    constraints = ROOT / "tests" / "constraints" / f"torch-{torch_cuda}.txt"
    pins = dict(line.split("==") for line in constraints.read_text().splitlines() if line and line[0] != "#")
    v = make_venv()
    v.pip("-c", str(constraints), f"cula[{name}]")
    r = report(v)
    assert r["warnings"] == [] and r["backend"] == name and "error" not in r, r
    installed = v.run("", args=("-c", INSTALLED_VERSION, RUNTIME_DIST[name])).stdout.strip()
    if RUNTIME_DIST[name] in pins:
        assert installed == pins[RUNTIME_DIST[name]]
    assert r["runtime"] == cuda_version(installed)
    assert r["found_via"].startswith("RUNPATH")


def test_runtime_already_loaded_by_another_library(make_venv, wheels, tmp_path):
    """Another library (PyTorch, say) loaded its own libcudart.so.12 first: the backend uses that
    one (same SONAME), and the loader says so instead of crediting the RUNPATH."""
    v = make_venv()
    v.pip("cula[cu12]")
    v.pip("--target", str(tmp_path / "other"), "nvidia-cuda-runtime-cu12==12.6.77")
    other = tmp_path / "other" / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12"
    code = f"import ctypes; ctypes.CDLL({str(other)!r}, mode=ctypes.RTLD_GLOBAL)\n" + REPORT
    out = v.run(code)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["backend"] == "cu12" and r["cudart"] == os.path.realpath(other) and r["runtime"] == 12060
    assert r["found_via"] == "already loaded in this process by another library (same SONAME)"
