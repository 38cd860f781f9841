"""The backends build from their sdists (as `pip wheel cula_cu12-<v>.tar.gz` does on a user's
machine) with no CUDA toolkit on the machine: /usr/local/cuda* is hidden behind empty mounts in a
private mount namespace, CUDA variables are unset and PATH holds no CUDA folder. The toolchain
comes only from the NVIDIA pip wheels named in each backend's build requirements.

A second build of the release configuration, in other folders, gives the very bytes of the
extension in dist/: the build is reproducible."""

from __future__ import annotations

import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import BUILD_PYTHON, DIST, ROOT, VERSION, build_requires, release


def _can_unshare() -> bool:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True)
    return probe.returncode == 0


needs_unshare = pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare(1) to hide /usr/local/cuda")


def build_without_toolkit(sdist: Path, tmp_path: Path, **extra_env: str) -> Path:
    """pip wheel <sdist> with /usr/local/cuda* hidden; returns the extracted _C extension."""
    hidden = sorted(p for p in glob.glob("/usr/local/cuda*") if os.path.isdir(p) and not os.path.islink(p))
    mounts = " && ".join(f"mount -t tmpfs none {p}" for p in hidden) or "true"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CUDA", "NVCC", "CULA_")) and k not in ("CPATH", "LIBRARY_PATH", "LD_LIBRARY_PATH")}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if "cuda" not in p.lower())
    env.update(extra_env)
    script = (f"{mounts} && test ! -e /usr/local/cuda/include/cuda_runtime.h && "
              f"{BUILD_PYTHON} -m pip wheel -q --no-deps -w {tmp_path / 'dist'} {sdist}")
    out = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (wheel,) = glob.glob(str(tmp_path / "dist" / "cula_cu*.whl"))
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp_path / "wheel")
    (so,) = (tmp_path / "wheel").glob("cula_cu*/_C*.so")
    return so


@needs_unshare
@pytest.mark.parametrize("backend", ["cu12", "cu13"])
def test_sdist_builds_with_gxx_and_no_cuda_toolkit(backend, tmp_path):
    sdist = DIST / f"cula_{backend}-{VERSION}.tar.gz"
    so = build_without_toolkit(sdist, tmp_path, CULA_BUILD_DIR=str(tmp_path / "build"), CXX="g++")
    (commands,) = glob.glob(str(tmp_path / "build" / "*" / "compile_commands.json"))
    entries = json.loads(Path(commands).read_text())
    assert entries and all(e["command"].split()[0].endswith("g++") for e in entries if e["file"].endswith(".cpp"))
    text = Path(commands).read_text()
    assert "/usr/local/cuda" not in text and "site-packages/nvidia/" in text
    dynamic = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True, check=True).stdout
    assert f"[libcudart.so.{backend[2:]}]" in dynamic and "libstdc++.so.6" in dynamic


@needs_unshare
def test_release_build_is_reproducible(wheels, tmp_path):
    """The release configuration of cula-cu12 for this Python, rebuilt from the sdist in other
    folders (another unpack folder, build folder and build environment), is byte-identical to the
    extension in dist/."""
    shipped_wheel = wheels["cu12"]  # this Python's, this machine's
    with zipfile.ZipFile(shipped_wheel) as z:
        (name,) = [n for n in z.namelist() if "/_C." in n]
        shipped = z.read(name)
    rebuilt = build_without_toolkit(DIST / f"cula_cu12-{VERSION}.tar.gz", tmp_path,
                                    CULA_BUILD_DIR=str(tmp_path / "elsewhere"),
                                    CULA_ZIG_TARGET=f"{platform.machine()}-linux-gnu.{release.GLIBC}")
    assert rebuilt.read_bytes() == shipped, f"{rebuilt} differs from {name} in {shipped_wheel.name}"


def test_cubin_cache_key(tmp_path, monkeypatch):
    """build_fatbin.py --cache (what `make wheels` uses to compile each backend's cubins once): the
    key is the same for the same sources in another folder, and changes with a byte of any kernel
    file, a file added, an option, or the compiler library."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "native" / "tools"))
    import build_fatbin

    def tree(where: Path, header: bytes = b"#define X 1\n") -> Path:
        (where / "common").mkdir(parents=True)
        (where / "family.cu").write_text('#include "common/x.cuh"\n')
        (where / "common" / "x.cuh").write_bytes(header)
        return where

    lib = tmp_path / "libnvrtc.so.13"
    lib.write_bytes(b"nvrtc 1")

    def key(folder: Path, options: tuple[str, ...] = ("-std=c++17",)) -> str:
        return build_fatbin.cache_key([str(lib)], [*options, f"-I{folder}"], '#include "family.cu"\n')

    a, b = tree(tmp_path / "a"), tree(tmp_path / "elsewhere" / "b")
    first = key(a)
    assert len(first) == 64 and key(b) == first
    assert key(tree(tmp_path / "c", b"#define X 2\n")) != first
    (b / "common" / "y.cuh").write_text("")
    assert key(b) != first
    assert key(a, ("-std=c++17", "-lineinfo")) != first
    lib.write_bytes(b"nvrtc 2")
    assert key(a) != first


# A wgmma product whose accumulator is read (EARLY) while the wgmma that writes it may still run.
_EARLY_READ = r"""#include "common/wgmma.cuh"
extern "C" __global__ void k(float* out, const unsigned* in, unsigned long long desc) {
  float x[32];
  const unsigned a[4] = {in[0], in[1], in[2], in[3]};
  wgmma_fence();
  WgmmaRS<bf16_tag, 0>::run(x, a, desc, 0);
  wgmma_commit();
#ifdef EARLY
  out[threadIdx.x] = x[0];
#endif
  wgmma_wait<0>();
  for (int i = 0; i < 32; ++i) out[threadIdx.x * 32 + i] += x[i];
}
"""


def test_build_stops_at_an_injected_wgmma_wait(tmp_path):
    """build_fatbin.py fails where ptxas injects a wgmma wait (C7517): ptxas then waits for every
    wgmma of the warpgroup in flight, so products meant to run side by side run one after the
    other. The same kernel with its read after the wait builds. With the NVRTC and nvFatbin that
    the cu13 backend builds with (its pinned build requirements)."""
    requires = build_requires("cula-cu13")
    pins = [r for r in requires if r.startswith(("nvidia-cuda-nvrtc==", "nvidia-nvfatbin=="))]
    assert len(pins) == 2, requires
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), *pins],
                   check=True, capture_output=True)
    lib = site / "nvidia" / "cu13" / "lib"
    (tmp_path / "k.cu").write_text(_EARLY_READ)

    def build(*defines: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(ROOT / "native" / "tools" / "build_fatbin.py"),
                               "--nvrtc", str(lib / "libnvrtc.so.13"), "--nvfatbin", str(lib / "libnvfatbin.so.13"),
                               "--arch", "sm_90a", "-I", str(ROOT / "native" / "kernels"), *defines,
                               "-o", str(tmp_path / "out.fatbin"), str(tmp_path / "k.cu")],
                              capture_output=True, text=True)

    good = build()
    assert good.returncode == 0 and (tmp_path / "out.fatbin").stat().st_size > 0, good.stderr
    bad = build("-D", "EARLY")
    assert bad.returncode == 1, bad.stderr
    assert "injected a wgmma wait into out.cu (sm_90a)" in bad.stderr and "(C7517)" in bad.stderr, bad.stderr
