"""Test driver behind `make test` and `make gpu-test`.

CPU mode (default): makes a tools venv (.venvs/tools: pytest, numpy, CPU torch, cuobjdump) and
runs the CPU suite in it; the suite itself installs the built wheels into further fresh venvs.
GPU mode (--gpu): for each backend, a venv that sees the machine's torch/CuPy
(--system-site-packages) gets cula + that backend + its NVIDIA runtime wheel installed, and the
GPU suite runs there with CULA_BACKEND set. Wheels come from --dist (default dist/); --wheelhouse
adds a folder of NVIDIA wheels for machines without network (the GPU machine).
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ["pytest>=8", "numpy", "nvidia-cuda-cuobjdump>=13,<14"]
TORCH_CPU = "torch==2.13.0"  # the CPU build the dev and CI machines keep on disk (Python 3.11)
RUNTIME_WHEEL = {"cu12": "nvidia_cuda_runtime_cu12-12.9.79-*.whl", "cu13": "nvidia_cuda_runtime-13.0.96-*.whl"}


def sh(*cmd: str, env: dict | None = None) -> int:
    print("+", " ".join(cmd), flush=True)
    return subprocess.call(cmd, env=env)


def make_venv(path: Path, system_site: bool = False) -> Path:
    if not (path / "bin" / "python").exists():
        venv.EnvBuilder(with_pip=True, system_site_packages=system_site, clear=True).create(path)
    return path / "bin" / "python"


def cpu(args: argparse.Namespace) -> int:
    py = make_venv(ROOT / ".venvs" / "tools")
    pkgs = list(TOOLS)
    if sys.version_info[:2] == (3, 11):
        pkgs.append(TORCH_CPU)
    if sh(str(py), "-m", "pip", "install", "-q", *pkgs) != 0:
        return 1
    # The selector and the cu12 backend under test (tests/test_checks.py imports cula), always
    # the wheels just built, even when a wheel of the same version is already installed.
    dist = Path(args.dist)
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    built = glob.glob(str(dist / "cula-*.whl")) + glob.glob(str(dist / f"cula_cu12-*-{tag}-*.whl"))
    if len(built) != 2:
        print(f"test: cula and cula-cu12 wheels for {tag} not found in {dist}: run make wheels", file=sys.stderr)
        return 1
    if sh(str(py), "-m", "pip", "install", "-q", "--find-links", str(dist), "cula[cu12]") != 0 or \
            sh(str(py), "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", *built) != 0:
        return 1
    env = dict(os.environ, CULA_TEST_DIST=str(Path(args.dist).resolve()), CULA_TEST_PYTHON=sys.executable)
    return sh(str(py), "-m", "pytest", str(ROOT / "tests"), "--ignore", str(ROOT / "tests" / "gpu"), *args.pytest,
              env=env)


def gpu(args: argparse.Namespace) -> int:
    # The GPU machine's python3 is itself a venv holding torch and CuPy, which a nested venv
    # cannot see; so each backend goes into a --target folder put first on PYTHONPATH.
    dist = Path(args.dist)
    status = 0
    for name in args.backends:
        site = ROOT / ".venvs" / f"gpu-{name}"
        tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
        wheels = glob.glob(str(dist / "cula-*.whl")) + glob.glob(str(dist / f"cula_{name}-*-{tag}-*.whl"))
        if len(wheels) < 2:
            print(f"gpu-test: cula and cula-{name} wheels for {tag} not found in {dist}", file=sys.stderr)
            return 1
        install = [sys.executable, "-m", "pip", "install", "-q", "--upgrade", "--target", str(site)]
        if args.wheelhouse:
            wheels += glob.glob(str(Path(args.wheelhouse) / RUNTIME_WHEEL[name]))
            install += ["--no-index", "--no-deps", *wheels]
        else:
            install += ["--find-links", str(dist), f"cula[{name}]"]
        if sh(*install) != 0:
            return 1
        env = dict(os.environ, CULA_BACKEND=name, PYTHONPATH=os.pathsep.join(
            [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]))
        status |= sh(sys.executable, "-m", "pytest", str(ROOT / "tests" / "gpu"), *args.pytest, env=env)
        if args.selftest:
            status |= sh(sys.executable, "-m", "cula", "--selftest", env=env)
    return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true", help="run the GPU suite (per backend) instead of the CPU suite")
    parser.add_argument("--dist", default=str(ROOT / "dist"), help="folder with the built wheels")
    parser.add_argument("--wheelhouse", help="folder with NVIDIA runtime wheels (offline installs)")
    parser.add_argument("--backends", nargs="+", default=["cu12", "cu13"])
    parser.add_argument("--selftest", action="store_true", help="GPU mode: also run python -m cula --selftest")
    parser.add_argument("pytest", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args()
    return gpu(args) if args.gpu else cpu(args)


if __name__ == "__main__":
    sys.exit(main())
