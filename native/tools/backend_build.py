"""Build logic shared by the cula-cu12 and cula-cu13 hatchling hooks.

Both backends build the same native/ tree; they differ only by the CUDA major, which selects
the NVIDIA pip wheels (installed as build requirements) that provide headers, libcudart,
NVRTC and nvFatbin. No CUDA toolkit on the machine is used: every path passed to CMake points
into the build environment's site-packages.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

ARCHS = ("sm_90a", "sm_100f")


@dataclass(frozen=True)
class Toolchain:
    """Where the NVIDIA wheels of one CUDA major keep what the build needs (site-packages/nvidia/...)."""

    major: int
    include_dirs: tuple[str, ...]  # runtime headers (+ crt headers, which cu12 keeps in cuda_nvcc)
    cudart: str
    nvrtc: str
    nvfatbin: str
    rpath: str  # from site-packages/cula_cuNN/ to the runtime wheel's lib dir

    @staticmethod
    def layout(major: int) -> dict[str, str]:
        if major == 12:
            return {"include": "cuda_runtime/include", "crt": "cuda_nvcc/include",
                    "cudart": "cuda_runtime/lib/libcudart.so.12", "nvrtc": "cuda_nvrtc/lib/libnvrtc.so.12",
                    "nvfatbin": "nvfatbin/lib/libnvfatbin.so.12", "rpath": "$ORIGIN/../nvidia/cuda_runtime/lib"}
        if major == 13:
            return {"include": "cu13/include", "crt": "cu13/include", "cudart": "cu13/lib/libcudart.so.13",
                    "nvrtc": "cu13/lib/libnvrtc.so.13", "nvfatbin": "cu13/lib/libnvfatbin.so.13",
                    "rpath": "$ORIGIN/../nvidia/cu13/lib"}
        raise ValueError(f"unsupported CUDA major {major}")

    @classmethod
    def from_wheels(cls, major: int) -> Toolchain:
        spec = importlib.util.find_spec("nvidia")
        roots = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
        lay = cls.layout(major)

        def find(rel: str) -> str:
            for root in roots:
                if (root / rel).exists():
                    return str(root / rel)
            raise RuntimeError(
                f"cula build: nvidia/{rel} not found in {[str(r) for r in roots]}; the NVIDIA CUDA {major} "
                "wheels listed in [build-system] requires must be installed in the build environment")

        includes = tuple(dict.fromkeys((find(lay["include"]), find(lay["crt"]))))
        return cls(major, includes, find(lay["cudart"]), find(lay["nvrtc"]), find(lay["nvfatbin"]), lay["rpath"])


def read_version(project_root: Path) -> str:
    for candidate in (project_root / "VERSION", project_root.parent.parent / "VERSION"):
        if candidate.exists():
            return candidate.read_text().strip()
    raise RuntimeError(f"cula build: no VERSION file next to {project_root} or at the repository root")


def native_dir(project_root: Path) -> Path:
    for candidate in (project_root / "native", project_root.parent.parent / "native"):
        if (candidate / "CMakeLists.txt").exists():
            return candidate
    raise RuntimeError(f"cula build: native/ source tree not found from {project_root}")


def build_extension(project_root: Path, major: int, version: str) -> Path:
    """Configure and build native/ for `major`; return the path of the built _C extension."""
    tools = Toolchain.from_wheels(major)
    native = native_dir(project_root)
    tag = f"cu{major}-{sys.implementation.cache_tag}-{sysconfig.get_platform()}"
    build_dir = Path(os.environ.get("CULA_BUILD_DIR", native.parent / "build")) / tag
    build_dir.mkdir(parents=True, exist_ok=True)
    # pip's isolated build environments live at a new temporary path each time; CMake's cache
    # remembers the tools' paths, so start a fresh configure when the environment moved.
    stamp = build_dir / "build-env.txt"
    env_id = f"{sys.prefix}\n{shutil.which('cmake')}\n{tools}\n"
    if not stamp.exists() or stamp.read_text() != env_id:
        shutil.rmtree(build_dir / "CMakeFiles", ignore_errors=True)
        (build_dir / "CMakeCache.txt").unlink(missing_ok=True)
        stamp.write_text(env_id)

    import pybind11  # a build requirement

    env = {k: v for k, v in os.environ.items()
           if k not in ("CUDA_HOME", "CUDA_PATH", "CUDACXX", "CPATH", "LIBRARY_PATH", "CUDA_TOOLKIT_ROOT_DIR")}
    configure = [
        "cmake", "-S", str(native), "-B", str(build_dir), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
        f"-DPython_EXECUTABLE={sys.executable}", f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
        f"-DCULA_CUDA_MAJOR={major}", f"-DCULA_VERSION={version}", f"-DCULA_ARCHS={';'.join(ARCHS)}",
        f"-DCULA_CUDA_INCLUDE_DIRS={';'.join(tools.include_dirs)}", f"-DCULA_CUDART_LIBRARY={tools.cudart}",
        f"-DCULA_CUDART_RPATH={tools.rpath}", f"-DCULA_NVRTC_LIBRARY={tools.nvrtc}",
        f"-DCULA_NVFATBIN_LIBRARY={tools.nvfatbin}", "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON",
    ]
    subprocess.run(configure, check=True, env=env)
    subprocess.run(["cmake", "--build", str(build_dir), "--verbose"], check=True, env=env)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    ext = build_dir / f"_C{suffix}"
    if not ext.exists():
        raise RuntimeError(f"cula build: CMake finished but {ext} is missing")
    return ext
