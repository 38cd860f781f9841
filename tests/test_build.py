"""The backends build with no CUDA toolkit on the machine: /usr/local/cuda* is hidden behind empty
mounts in a private mount namespace, CUDA variables are unset and PATH holds no CUDA folder. The
toolchain comes only from the NVIDIA pip wheels named in each backend's build requirements."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from conftest import BUILD_PYTHON, ROOT


def _can_unshare() -> bool:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare(1) to hide /usr/local/cuda")
@pytest.mark.parametrize("backend", ["cula-cu12", "cula-cu13"])
def test_build_without_cuda_toolkit(backend, tmp_path):
    hidden = sorted(p for p in glob.glob("/usr/local/cuda*") if os.path.isdir(p) and not os.path.islink(p))
    mounts = " && ".join(f"mount -t tmpfs none {p}" for p in hidden) or "true"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CUDA", "NVCC", "CULA_")) and k not in ("CPATH", "LIBRARY_PATH", "LD_LIBRARY_PATH")}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if "cuda" not in p.lower())
    env["CULA_BUILD_DIR"] = str(tmp_path / "build")
    script = (f"{mounts} && test ! -e /usr/local/cuda/include/cuda_runtime.h && "
              f"{BUILD_PYTHON} -m pip wheel -q --no-deps -w {tmp_path / 'dist'} {ROOT / 'packages' / backend}")
    out = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (wheel,) = glob.glob(str(tmp_path / "dist" / f"{backend.replace('-', '_')}-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        assert any("/_C." in n for n in z.namelist())
    (commands,) = glob.glob(str(tmp_path / "build" / "*" / "compile_commands.json"))
    text = Path(commands).read_text()
    assert "/usr/local/cuda" not in text and "site-packages/nvidia/" in text
