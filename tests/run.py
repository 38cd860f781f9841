"""Test driver behind `make test` and `make gpu-test`.

CPU mode (default): makes a tools venv (.venvs/tools: pytest, numpy, CPU torch, cuobjdump) and
runs the CPU suite in it; the suite itself installs the built wheels into further fresh venvs.
GPU mode (--gpu): for each backend, cula + that backend + its NVIDIA runtime wheel are installed
into a folder put first on PYTHONPATH (the machine's torch/CuPy stay visible), FLA (the reference)
into another, and the GPU suite runs with CULA_BACKEND set. Bench mode (--bench): the same
installs, then benchmarks/bench.py per backend. Compare mode (--compare OLD): two builds, the
wheels of OLD and of --dist, timed on bench.py's configs in turns. Wheels come from --dist
(default dist/); --wheelhouse adds a folder of NVIDIA wheels (and bench/ with FLA and matplotlib)
for machines without network (the GPU machine).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ["pytest>=8", "numpy", "nvidia-cuda-cuobjdump>=13,<14", "nvidia-cuda-nvdisasm>=13,<14", "auditwheel==6.8.2",
         "cibuildwheel==4.3.3", "check-jsonschema==0.39.0"]  # the release workflow's checks
TORCH_CPU = "torch==2.13.0"  # the CPU build the dev and CI machines keep on disk (Python 3.11)
# FLA and the Triton it imports, beside CPU torch: tests/test_fla_backend.py checks cula's FLA backend
# registration on the CPU.
FLA_CPU = ["fla-core==0.6.0", "einops==0.8.2", "triton==3.9.0"]
sys.path.insert(0, str(ROOT / "tools"))
import release  # noqa: E402  (the backends' runtime pins and bounds, read from their pyprojects)


def backend_wheels(dist: Path, name: str) -> list[str]:
    """The selector and the backend wheel for this interpreter and machine."""
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    return glob.glob(str(dist / "cula-*.whl")) + \
        glob.glob(str(dist / f"cula_{name}-*-{tag}-{tag}-*_{platform.machine()}.whl"))


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
        pkgs += [TORCH_CPU, *FLA_CPU]
    if sh(str(py), "-m", "pip", "install", "-q", *pkgs) != 0:
        return 1
    # The selector and the cu12 backend under test (tests/test_checks.py imports cula), always
    # the wheels just built, even when a wheel of the same version is already installed.
    dist = Path(args.dist)
    built = backend_wheels(dist, "cu12")
    if len(built) != 2:
        print(f"test: cula and cula-cu12 wheels for this Python not found in {dist}: run make wheels", file=sys.stderr)
        return 1
    if sh(str(py), "-m", "pip", "install", "-q", "--find-links", str(dist), "cula[cu12]") != 0 or \
            sh(str(py), "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", *built) != 0:
        return 1
    env = dict(os.environ, CULA_TEST_DIST=str(Path(args.dist).resolve()), CULA_TEST_PYTHON=sys.executable,
               PATH=f"{py.parent}{os.pathsep}{os.environ['PATH']}")  # auditwheel
    # --durations: where the suite's minutes go, in every CI log (CI has 90 minutes for the build and this)
    return sh(str(py), "-m", "pytest", str(ROOT / "tests"), "--ignore", str(ROOT / "tests" / "gpu"), "--durations=15",
              *args.pytest, env=env)


BENCH_EXTRAS = ["fla-core==0.6.0", "flash-linear-attention==0.6.0"]  # the reference, without its deps
PLOT = ["matplotlib"]
# --fetch-wheelhouse: what a GPU machine without network needs beside its torch (and numpy): FLA,
# the einops it imports, matplotlib and its dependencies, all taken with --no-deps there.
OFFLINE_EXTRAS = [*BENCH_EXTRAS, "einops==0.8.2", *PLOT, "contourpy", "cycler", "fonttools", "kiwisolver", "pillow",
                  "pyparsing", "python-dateutil", "six", "packaging"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]


def install_extras(args: argparse.Namespace, site: Path = ROOT / ".venvs" / "extras") -> Path | None:
    """FLA (the reference of the FLA-compat tests and of the benchmark) and matplotlib, into a
    --target folder: from <wheelhouse>/bench when given (the GPU machine has no network), else PyPI.
    FLA goes in without its dependencies (transformers, and above all no second torch)."""
    shutil.rmtree(site, ignore_errors=True)
    pip = [sys.executable, "-m", "pip", "install", "-q", "--target", str(site)]
    if args.wheelhouse:
        found = sorted(glob.glob(str(Path(args.wheelhouse) / "bench" / "*.whl")))
        if not found:
            print(f"run.py: no FLA / matplotlib wheels in {args.wheelhouse}/bench; going without", file=sys.stderr)
            return None
        ok = sh(*pip, "--no-index", "--no-deps", *found) == 0
    else:
        ok = sh(*pip, "--no-deps", *BENCH_EXTRAS) == 0 and sh(*pip, *PLOT) == 0
    if not ok:
        print("run.py: installing FLA / matplotlib failed; going without", file=sys.stderr)
        return None
    return site


def install_backend(args: argparse.Namespace, name: str, extras: Path | None, dist: Path | None = None,
                    site: Path | None = None) -> dict | None:
    """cula + cula-<name> + its NVIDIA runtime wheel (from `dist`, default --dist) into a --target
    folder (default .venvs/gpu-<name>); returns the environment that sees them (None on failure).
    The GPU machine's python3 is itself a venv holding torch and CuPy, which a nested venv cannot
    see: hence folders put first on PYTHONPATH."""
    dist = Path(dist or args.dist)
    site = site or ROOT / ".venvs" / f"gpu-{name}"
    shutil.rmtree(site, ignore_errors=True)
    wheels = backend_wheels(dist, name)
    if len(wheels) < 2:
        print(f"run.py: cula and cula-{name} wheels for this Python not found in {dist}", file=sys.stderr)
        return None
    dist_name, built = release.runtime_pin(name).split("==")
    runtime = {"built": built, "lowest": release.runtime_lowest(name)}.get(args.runtime, args.runtime)
    wheel_name = dist_name.replace("-", "_")
    install = [sys.executable, "-m", "pip", "install", "-q", "--upgrade", "--target", str(site)]
    if args.wheelhouse:
        found = glob.glob(str(Path(args.wheelhouse) / f"{wheel_name}-{runtime}-*.whl"))
        if not found:
            print(f"run.py: no {wheel_name} {runtime} wheel in {args.wheelhouse}", file=sys.stderr)
            return None
        install += ["--no-index", "--no-deps", *wheels, *found]
    else:
        install += ["--find-links", str(dist), *wheels, f"{dist_name}=={runtime}"]
    print(f"run.py: cula-{name} with runtime {runtime}", flush=True)
    if sh(*install) != 0:
        return None
    return dict(os.environ, CULA_BACKEND=name, PYTHONPATH=os.pathsep.join(
        [str(site), *([str(extras)] if extras else []), *filter(None, [os.environ.get("PYTHONPATH")])]))


def each_backend(args: argparse.Namespace, run) -> int:
    """Installs each backend in turn (and the extras once) and calls run(env) with its environment."""
    extras = install_extras(args)
    status = 0
    for name in args.backends:
        env = install_backend(args, name, extras)
        if env is None:
            return 1
        status |= run(env)
    return status


def gpu(args: argparse.Namespace) -> int:
    def run(env: dict) -> int:
        status = sh(sys.executable, "-m", "pytest", str(ROOT / "tests" / "gpu"), *args.pytest, env=env)
        if args.selftest:
            status |= sh(sys.executable, "-m", "cula", "--selftest", env=env)
        return status
    return each_backend(args, run)


def bench(args: argparse.Namespace) -> int:
    """benchmarks/bench.py once per backend; each writes benchmarks/results/<gpu>-<backend>.md/.png."""
    return each_backend(args, lambda env: sh(sys.executable, str(ROOT / "benchmarks" / "bench.py"), *args.pytest,
                                             env=env))


def compare(args: argparse.Namespace) -> int:
    """benchmarks/bench.py's configs, cula alone (--no-fla, the configs table), with the wheels of
    --compare (old) and of --dist (new) in turns, old new old new ..., so that a drift of the GPU's
    clocks falls on both; then each config's times side by side and whether the two builds' outputs
    have the same sums. Extra arguments go to bench.py (--cases, --variants)."""
    for name in args.backends:
        envs = {}
        for label, dist in (("old", args.compare), ("new", args.dist)):
            envs[label] = install_backend(args, name, None, Path(dist), ROOT / ".venvs" / f"compare-{label}-{name}")
            if envs[label] is None:
                return 1
        work = ROOT / ".venvs" / f"compare-results-{name}"
        shutil.rmtree(work, ignore_errors=True)
        runs: dict[str, list[dict]] = {"old": [], "new": []}
        for r in range(args.rounds):
            for label in ("old", "new"):
                out = work / f"{label}{r}"
                if sh(sys.executable, str(ROOT / "benchmarks" / "bench.py"), "--no-fla", "--parts", "configs",
                      "--out-dir", str(out), "--name", "compare", *args.pytest, env=envs[label]) != 0:
                    return 1
                runs[label].append(json.loads((out / "compare.json").read_text())["configs"])
        print(f"\n## cula-{name}: old {args.compare}, new {args.dist}\n\n{compare_table(runs['old'], runs['new'])}",
              flush=True)
    return 0


def compare_table(old: list[dict], new: list[dict]) -> str:
    """The markdown table of compare(): per config and variant, each round's ms of both builds, the
    ratio of their medians, and whether the output sums of the first rounds are equal."""
    head = ["config", "variant", "old ms", "new ms", "new / old", "outputs"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for config, first in new[0].items():
        if config not in old[0]:
            continue
        a, b = old[0][config]["sums"], first["sums"]
        if a == b:
            same = "same"
        elif len(a) != len(b):
            same = "differ (not the same outputs)"
        else:
            rel = max(abs(x - y) / max(abs(x), abs(y), 1e-30) for x, y in zip(a, b, strict=True))
            same = f"differ (sums, relative: {rel:.1e})"
        for variant in first["ms"]:
            t_old = [run[config]["ms"][variant] for run in old if config in run]
            t_new = [run[config]["ms"][variant] for run in new if config in run]
            ratio = statistics.median(t_new) / statistics.median(t_old)
            lines.append("| " + " | ".join([config, variant, ", ".join(f"{t:.4f}" for t in t_old),
                                            ", ".join(f"{t:.4f}" for t in t_new), f"{ratio:.3f}", same]) + " |")
    return "\n".join(lines)


def fetch_wheelhouse(args: argparse.Namespace) -> int:
    """--fetch-wheelhouse DIR (on a machine with network): what --wheelhouse DIR takes on a GPU
    machine without one, for its CPython (--python-version) on x86_64: each backend's NVIDIA runtime
    wheel at the version it builds against and at its requirement's lower bound (--runtime built,
    lowest), and in DIR/bench FLA and matplotlib with their dependencies (OFFLINE_EXTRAS)."""
    where = Path(args.fetch_wheelhouse)
    pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--implementation", "cp",
           "--python-version", args.python_version, *(f"--platform={p}" for p in PLATFORMS)]
    for name in args.backends:
        dist_name, built = release.runtime_pin(name).split("==")
        for version in sorted({built, release.runtime_lowest(name)}):
            if sh(*pip, "-d", str(where), f"{dist_name}=={version}") != 0:
                return 1
    return sh(*pip, "-d", str(where / "bench"), *OFFLINE_EXTRAS)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true", help="run the GPU suite (per backend) instead of the CPU suite")
    parser.add_argument("--bench", action="store_true", help="run benchmarks/bench.py (per backend) on a GPU")
    parser.add_argument("--compare", metavar="OLD_DIST",
                        help="on a GPU: time the wheels of OLD_DIST against those of --dist (bench.py's configs, "
                             "cula alone, in turns)")
    parser.add_argument("--rounds", type=int, default=2, help="compare mode: turns of each build (default 2)")
    parser.add_argument("--fetch-wheelhouse", metavar="DIR",
                        help="download what --wheelhouse DIR takes on a GPU machine without network, and stop")
    parser.add_argument("--python-version", default="3.12",
                        help="--fetch-wheelhouse: the GPU machine's CPython (default 3.12)")
    parser.add_argument("--dist", default=str(ROOT / "dist"), help="folder with the built wheels")
    parser.add_argument("--wheelhouse", help="folder with NVIDIA runtime wheels (offline installs)")
    parser.add_argument("--backends", nargs="+", default=["cu12", "cu13"])
    parser.add_argument("--selftest", action="store_true", help="GPU mode: also run python -m cula --selftest")
    parser.add_argument("--runtime", default="built",
                        help="GPU mode: NVIDIA runtime wheel version to run with: built (what the backend builds "
                             "against), lowest (its requirement's lower bound) or an exact version")
    parser.add_argument("pytest", nargs="*", help="extra pytest (or bench.py) arguments (after --)")
    args = parser.parse_args()
    if args.fetch_wheelhouse:
        return fetch_wheelhouse(args)
    if args.compare:
        return compare(args)
    return bench(args) if args.bench else gpu(args) if args.gpu else cpu(args)


if __name__ == "__main__":
    sys.exit(main())
