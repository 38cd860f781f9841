"""Build logic shared by the cula-cu12 and cula-cu13 hatchling hooks.

Both backends build the same native/ tree; they differ only by the CUDA major, which selects
the NVIDIA pip wheels (installed as build requirements) that provide headers, libcudart,
NVRTC and nvFatbin. No CUDA toolkit on the machine is used: every path passed to CMake points
into the build environment's site-packages.

Host code is compiled by the machine's C++ compiler (g++, or $CXX) by default. Release builds set
CULA_ZIG_TARGET (e.g. x86_64-linux-gnu.2.17): the host code is then compiled by zig from the
`ziglang` wheel against exactly that glibc, with libc++ linked statically, so the wheel meets
manylinux_2_17 whatever the build machine's glibc, and aarch64 can be built on x86_64. A
cross build links against the target's libcudart, which CULA_TARGET_SITE points at (a folder
holding the target's nvidia/ runtime wheel); the device code is the same for every host arch.
CULA_CUBIN_CACHE names a folder where the cubins of one set of device sources are kept for the
next build (native/tools/build_fatbin.py --cache).
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

ARCHS = ("sm_90a", "sm_100f")
ZIG = "ziglang==0.15.2"  # the release compiler, added to the build requirements when CULA_ZIG_TARGET is set


@dataclass(frozen=True)
class Target:
    """The machine the extension is built for: this one (system compiler) or a zig target triple."""

    arch: str  # x86_64 / aarch64
    zig: str | None  # "<arch>-linux-gnu.<glibc>" or None for the system compiler
    site: Path | None  # a cross build's target site-packages holding nvidia/ (CULA_TARGET_SITE)

    @classmethod
    def from_env(cls) -> Target:
        zig = os.environ.get("CULA_ZIG_TARGET") or None
        arch = zig.split("-", 1)[0] if zig else platform.machine()
        if zig and (arch not in ("x86_64", "aarch64") or "-linux-gnu." not in zig):
            raise RuntimeError(f"cula build: CULA_ZIG_TARGET must look like x86_64-linux-gnu.2.17 or "
                               f"aarch64-linux-gnu.2.17, got {zig!r}")
        site = os.environ.get("CULA_TARGET_SITE")
        target = cls(arch, zig, Path(site).resolve() if site else None)
        if target.cross and target.site is None:
            raise RuntimeError(f"cula build: building for {arch} on {platform.machine()} needs CULA_TARGET_SITE, a "
                               f"folder with the {arch} NVIDIA runtime wheel installed (pip install --target DIR "
                               f"--platform manylinux2014_{arch} --only-binary=:all: --no-deps ...)")
        return target

    @property
    def cross(self) -> bool:
        return self.arch != platform.machine()

    def ext_suffix(self) -> str:
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        return suffix.replace(platform.machine(), self.arch) if self.cross else suffix

    def wheel_tag(self) -> str | None:
        """The wheel tag of a cross build (hatchling infers it for native ones)."""
        if not self.cross:
            return None
        py = f"cp{sys.version_info[0]}{sys.version_info[1]}"
        return f"{py}-{py}-linux_{self.arch}"

    def zig_wrappers(self, build_dir: Path) -> dict[str, str]:
        """Compiler wrappers for CMake: `python -m ziglang cc|c++ -target <triple>`."""
        tools = {}
        for var, mode in (("CC", "cc"), ("CXX", "c++")):
            wrapper = build_dir / f"zig-{mode}"
            wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m ziglang {mode} -target {self.zig} "$@"\n')
            wrapper.chmod(0o755)
            tools[var] = str(wrapper)
        return tools


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
    def from_wheels(cls, major: int, target_site: Path | None = None) -> Toolchain:
        """The build environment's NVIDIA wheels; libcudart (and its headers) from `target_site`/nvidia
        when given, for a cross build. NVRTC and nvFatbin always run on the build machine."""
        spec = importlib.util.find_spec("nvidia")
        roots = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
        lay = cls.layout(major)

        def find(rel: str, where: list[Path] = roots) -> str:
            for root in where:
                if (root / rel).exists():
                    return str(root / rel)
            raise RuntimeError(
                f"cula build: nvidia/{rel} not found in {[str(r) for r in where]}; the NVIDIA CUDA {major} "
                "wheels listed in [build-system] requires must be installed in the build environment")

        runtime = [target_site / "nvidia"] if target_site else roots
        includes = tuple(dict.fromkeys((find(lay["include"], runtime), find(lay["crt"]))))
        return cls(major, includes, find(lay["cudart"], runtime), find(lay["nvrtc"]), find(lay["nvfatbin"]),
                   lay["rpath"])


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


def build_tools() -> tuple[str, str]:
    """cmake and ninja of the build environment (build requirements), not older ones earlier on PATH."""
    try:
        import cmake  # the PyPI packages
        import ninja
        return str(Path(cmake.CMAKE_BIN_DIR) / "cmake"), str(Path(ninja.BIN_DIR) / "ninja")
    except (ImportError, AttributeError):
        return shutil.which("cmake") or "cmake", shutil.which("ninja") or "ninja"


def build_extension(project_root: Path, major: int, version: str, target: Target | None = None) -> Path:
    """Configure and build native/ for `major`; return the path of the built _C extension."""
    target = target or Target.from_env()
    tools = Toolchain.from_wheels(major, target.site if target.cross else None)
    native = native_dir(project_root)
    plat = f"linux-{target.arch}" if target.zig else sysconfig.get_platform()
    tag = f"cu{major}-{sys.implementation.cache_tag}-{plat}" + ("-zig" if target.zig else "")
    build_dir = Path(os.environ.get("CULA_BUILD_DIR", native.parent / "build")) / tag
    build_dir.mkdir(parents=True, exist_ok=True)
    cmake, ninja = build_tools()
    # pip's isolated build environments live at a new temporary path each time; CMake's cache
    # remembers the tools' paths, so start a fresh configure when the environment moved.
    stamp = build_dir / "build-env.txt"
    env_id = f"{sys.prefix}\n{cmake}\n{tools}\n{target}\n{os.environ.get('CXX')}\n"
    if not stamp.exists() or stamp.read_text() != env_id:
        shutil.rmtree(build_dir / "CMakeFiles", ignore_errors=True)
        (build_dir / "CMakeCache.txt").unlink(missing_ok=True)
        stamp.write_text(env_id)

    import pybind11  # a build requirement

    env = {k: v for k, v in os.environ.items()
           if k not in ("CUDA_HOME", "CUDA_PATH", "CUDACXX", "CPATH", "LIBRARY_PATH", "CUDA_TOOLKIT_ROOT_DIR")}
    if target.zig:
        env.update(target.zig_wrappers(build_dir))
    suffix = target.ext_suffix()
    configure = [
        cmake, "-S", str(native), "-B", str(build_dir), "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}",
        "-DCMAKE_BUILD_TYPE=Release",
        f"-DCULA_EXT_SUFFIX={suffix}",
        f"-DPython_EXECUTABLE={sys.executable}", f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
        f"-DCULA_CUDA_MAJOR={major}", f"-DCULA_VERSION={version}", f"-DCULA_ARCHS={';'.join(ARCHS)}",
        f"-DCULA_CUDA_INCLUDE_DIRS={';'.join(tools.include_dirs)}", f"-DCULA_CUDART_LIBRARY={tools.cudart}",
        f"-DCULA_CUDART_RPATH={tools.rpath}", f"-DCULA_NVRTC_LIBRARY={tools.nvrtc}",
        f"-DCULA_NVFATBIN_LIBRARY={tools.nvfatbin}", "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON",
        # Cubins kept between builds of the same device code (tools/release.py; build_fatbin.py --cache).
        f"-DCULA_CUBIN_CACHE={os.environ.get('CULA_CUBIN_CACHE', '')}",
    ]
    if target.cross:
        # Python's headers are named, not searched for: those of the running CPython, the target's
        # version (on 64-bit Linux its pyconfig.h differs from the target's in build details, not in
        # the ABI; what CMake 4.4.4 found itself). Under policy CMP0190's OLD setting, CMake
        # 4.4.5's FindPython no longer asks the interpreter when cross-compiling and fails: "Could
        # NOT find Python (missing: Python_INCLUDE_DIRS Development.Module)".
        configure += ["-DCMAKE_SYSTEM_NAME=Linux", f"-DCMAKE_SYSTEM_PROCESSOR={target.arch}",
                      f"-DPython_INCLUDE_DIR={sysconfig.get_paths()['include']}"]
    subprocess.run(configure, check=True, env=env)
    subprocess.run([cmake, "--build", str(build_dir), "--verbose"], check=True, env=env)
    ext = build_dir / f"_C{suffix}"
    if not ext.exists():
        raise RuntimeError(f"cula build: CMake finished but {ext} is missing")
    return ext
