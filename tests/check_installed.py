"""Checks one installed backend wheel in the current environment (cibuildwheel's test-command in
.github/workflows/release.yml; also usable by hand): its extension imports on this CPython and
arch, loads libcudart from NVIDIA's runtime wheel through its RUNPATH, and carries the cubins of
every supported GPU family; `python -m cula` reports it. Needs no GPU and no driver."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import subprocess
import sys


def main() -> int:
    installed = [name for name in ("cu12", "cu13") if importlib.util.find_spec(f"cula_{name}") is not None]
    if len(installed) != 1:
        print(f"check_installed: expected one cula backend installed, found {installed}", file=sys.stderr)
        return 1
    name = installed[0]
    ext = importlib.import_module(f"cula_{name}._C")
    problems = []
    if ext.CUDA_MAJOR != int(name[2:]) or ext.runtime_version() // 1000 != ext.CUDA_MAJOR:
        problems.append(f"CUDA major {ext.CUDA_MAJOR}, runtime {ext.runtime_version()}")
    if tuple(ext.ARCHS) != ("sm_90a", "sm_100f"):
        problems.append(f"fat binary targets {ext.ARCHS}")
    cudart = os.path.realpath(ext.runtime_library_path())
    if f"{os.sep}nvidia{os.sep}" not in cudart:
        problems.append(f"libcudart loaded from {cudart}, not from NVIDIA's runtime wheel")
    if ext.__version__ != importlib.metadata.version("cula"):
        problems.append(f"version {ext.__version__} but cula {importlib.metadata.version('cula')}")
    report = subprocess.run([sys.executable, "-m", "cula"], capture_output=True, text=True,
                            env=dict(os.environ, CULA_BACKEND=name))
    if report.returncode != 0 or f"cula-{name}" not in report.stdout:
        problems.append(f"python -m cula exited {report.returncode}:\n{report.stdout}{report.stderr}")
    print(f"cula-{name} {ext.__version__} on Python {sys.version.split()[0]}: runtime {ext.runtime_version()} "
          f"from {cudart}, targets {', '.join(ext.ARCHS)}")
    for problem in problems:
        print(f"check_installed: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
