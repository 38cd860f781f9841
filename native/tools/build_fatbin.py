"""Compile CUDA sources to SASS with NVRTC and pack the cubins into one fatbin with nvFatbin.

Used by native/CMakeLists.txt at build time. It needs only the NVIDIA pip wheels
(libnvrtc, libnvfatbin), never a CUDA toolkit, and embeds no PTX: a PTX-free fatbin
keeps CUDA minor-version compatibility (the driver never JIT-compiles anything).

    python build_fatbin.py --nvrtc LIB --nvfatbin LIB --arch sm_90a --arch sm_100f \
        -I DIR -o cula_kernels.fatbin family1.cu family2.cu

The sources are compiled as one program (one cubin per target, named after the output).

--cache DIR keeps each cubin under a key of everything that decides its bytes (the NVRTC and
nvFatbin libraries, the target, the options, and every file of the sources' and include folders), so
that the release build compiles each CUDA major's device code once, not once per CPython and host
arch (`tools/release.py` builds 8 wheels a backend from the same sources). NVRTC's output is
deterministic, so a cached cubin is the one a compile would give (tests/test_build.py rebuilds one
without the cache and compares the extension's bytes).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import glob
import hashlib
import multiprocessing
import os
import sys


class ToolError(RuntimeError):
    pass


def _load_nvrtc(path: str) -> ctypes.CDLL:
    # libnvrtc.so.13 from the pip wheel has no RUNPATH and cannot find its builtins
    # library next to it: load the builtins first, globally, so the dlopen inside
    # NVRTC finds the already-loaded SONAME.
    for builtins in sorted(glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so.*"))):
        ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(path)
    c_char_pp = ctypes.POINTER(ctypes.c_char_p)
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    lib.nvrtcGetErrorString.argtypes = [ctypes.c_int]
    lib.nvrtcCreateProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_char_p,
                                       ctypes.c_int, c_char_pp, c_char_pp]
    lib.nvrtcCompileProgram.argtypes = [ctypes.c_void_p, ctypes.c_int, c_char_pp]
    lib.nvrtcGetProgramLogSize.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
    lib.nvrtcGetProgramLog.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.nvrtcGetCUBINSize.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
    lib.nvrtcGetCUBIN.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    lib.nvrtcVersion.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
    for name in ("nvrtcCreateProgram", "nvrtcCompileProgram", "nvrtcGetProgramLogSize", "nvrtcGetProgramLog",
                 "nvrtcGetCUBINSize", "nvrtcGetCUBIN", "nvrtcDestroyProgram", "nvrtcVersion"):
        getattr(lib, name).restype = ctypes.c_int
    return lib


def _load_nvfatbin(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    lib.nvFatbinGetErrorString.restype = ctypes.c_char_p
    lib.nvFatbinGetErrorString.argtypes = [ctypes.c_int]
    lib.nvFatbinCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t]
    lib.nvFatbinAddCubin.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p,
                                     ctypes.c_char_p]
    lib.nvFatbinSize.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
    lib.nvFatbinGet.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.nvFatbinDestroy.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    for name in ("nvFatbinCreate", "nvFatbinAddCubin", "nvFatbinSize", "nvFatbinGet", "nvFatbinDestroy"):
        getattr(lib, name).restype = ctypes.c_int
    return lib


def _strings(items: list[str]):
    arr = (ctypes.c_char_p * len(items))(*[s.encode() for s in items])
    return arr


def compile_cubin(nvrtc: ctypes.CDLL, source: str, name: str, arch: str, options: list[str]) -> bytes:
    def check(rc: int, what: str) -> None:
        if rc != 0:
            raise ToolError(f"{what} failed for {name} ({arch}): {nvrtc.nvrtcGetErrorString(rc).decode()}")

    prog = ctypes.c_void_p()
    check(nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None),
          "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture={arch}", *options]
        rc = nvrtc.nvrtcCompileProgram(prog, len(opts), _strings(opts))
        log_size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(log_size))
        log = ctypes.create_string_buffer(log_size.value)
        nvrtc.nvrtcGetProgramLog(prog, log)
        text = log.value.decode(errors="replace").strip()
        if rc != 0:
            raise ToolError(f"NVRTC could not compile {name} for {arch}:\n{text}")
        if "wgmma.mma_async instructions are serialized" in text:
            # ptxas made every wgmma wait for the one before: correct, but several times slower.
            raise ToolError(f"ptxas serialised the wgmma pipeline of {name} ({arch}); fix the kernel:\n{text}")
        if "warpgroup.wait is injected" in text:
            # (C7517) ptxas waits for every wgmma in flight before one whose registers it must
            # touch: products meant to run side by side then run one after the other.
            raise ToolError(f"ptxas injected a wgmma wait into {name} ({arch}); fix the kernel:\n{text}")
        if text:
            print(f"[build_fatbin] {name} ({arch}):\n{text}", file=sys.stderr)
        size = ctypes.c_size_t()
        check(nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
        buf = ctypes.create_string_buffer(size.value)
        check(nvrtc.nvrtcGetCUBIN(prog, buf), "nvrtcGetCUBIN")
        return buf.raw
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))


def _compile_one(nvrtc_path: str, source: str, name: str, arch: str, options: list[str]) -> bytes:
    return compile_cubin(_load_nvrtc(nvrtc_path), source, name, arch, options)


def compile_all(nvrtc_path: str, source: str, name: str, archs: list[str], options: list[str]) -> dict[str, bytes]:
    """One cubin per target, the targets side by side in processes of their own where there are
    cores for them: NVRTC serialises compiles in one process (threads gain nothing), and a target
    takes minutes."""
    workers = min(len(archs), os.cpu_count() or 1)
    if workers <= 1:
        return {arch: _compile_one(nvrtc_path, source, name, arch, options) for arch in archs}
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        jobs = {arch: pool.submit(_compile_one, nvrtc_path, source, name, arch, options) for arch in archs}
        return {arch: job.result() for arch, job in jobs.items()}


def pack_fatbin(nvfatbin: ctypes.CDLL, cubins: list[tuple[str, str, bytes]]) -> bytes:
    def check(rc: int, what: str) -> None:
        if rc != 0:
            raise ToolError(f"{what} failed: {nvfatbin.nvFatbinGetErrorString(rc).decode()}")

    handle = ctypes.c_void_p()
    check(nvfatbin.nvFatbinCreate(ctypes.byref(handle), None, 0), "nvFatbinCreate")
    try:
        for ident, arch, cubin in cubins:
            # nvFatbin wants the numeric part of the target: "90a", "100f".
            check(nvfatbin.nvFatbinAddCubin(handle, cubin, len(cubin), arch.removeprefix("sm_").encode(),
                                            ident.encode()), f"nvFatbinAddCubin({ident}, {arch})")
        size = ctypes.c_size_t()
        check(nvfatbin.nvFatbinSize(handle, ctypes.byref(size)), "nvFatbinSize")
        buf = ctypes.create_string_buffer(size.value)
        check(nvfatbin.nvFatbinGet(handle, buf), "nvFatbinGet")
        return buf.raw
    finally:
        nvfatbin.nvFatbinDestroy(ctypes.byref(handle))


def _file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def cache_key(libraries: list[str], options: list[str], text: str) -> str:
    """The digest of what decides a program's cubins (the target is added per cubin): the compiler
    libraries' bytes, the options other than include folders (their paths differ between builds of
    the same sources), the program text, and the name and bytes of every file under the include
    folders (-I, in their order), in a fixed order."""
    h = hashlib.sha256()
    for lib in libraries:
        h.update(f"lib {os.path.basename(lib)} {_file_digest(lib)}\n".encode())
    for opt in options:
        if not opt.startswith("-I"):
            h.update(f"opt {opt}\n".encode())
    h.update(f"text {text}\n".encode())
    folders = dict.fromkeys(os.path.abspath(opt[2:]) for opt in options if opt.startswith("-I"))
    for i, folder in enumerate(folders):
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames.sort()
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                h.update(f"file {i} {os.path.relpath(path, folder)} {_file_digest(path)}\n".encode())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nvrtc", required=True, help="path to libnvrtc.so.NN")
    parser.add_argument("--nvfatbin", required=True, help="path to libnvfatbin.so.NN")
    parser.add_argument("--arch", action="append", required=True, help="real target, e.g. sm_90a, sm_100f")
    parser.add_argument("-I", dest="includes", action="append", default=[], help="include directory")
    parser.add_argument("-D", dest="defines", action="append", default=[], help="preprocessor define")
    parser.add_argument("--keep-cubins", help="also write each cubin into this directory")
    parser.add_argument("--cache", help="a folder of cubins kept between builds of the same sources (see above)")
    parser.add_argument("--lineinfo", action="store_true",
                        help="with source line information, for profiles (the same SASS; never for release builds)")
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("sources", nargs="+")
    args = parser.parse_args(argv)

    options = ["-std=c++17", "--device-as-default-execution-space", "-default-device", "--extra-device-vectorization"]
    options += [f"-I{d}" for d in args.includes] + [f"-D{d}" for d in args.defines]
    if args.lineinfo:
        options.append("-lineinfo")
    # One program of every source: a fatbin holds one cubin per target, and the driver loads only the
    # one that fits the GPU, so the kernels of all families must share it. Each source is included
    # by name (its folder is on the include path), and the program is named after the output.
    for d in dict.fromkeys(os.path.dirname(os.path.abspath(src)) for src in args.sources):
        options.append(f"-I{d}")
    text = "".join(f'#include "{os.path.basename(src)}"\n' for src in args.sources)
    base = os.path.splitext(os.path.basename(args.output))[0]
    key = None
    if args.cache:
        os.makedirs(args.cache, exist_ok=True)
        builtins = sorted(glob.glob(os.path.join(os.path.dirname(args.nvrtc), "libnvrtc-builtins.so.*")))
        key = cache_key([args.nvrtc, *builtins, args.nvfatbin, os.path.abspath(__file__)], options, text)

    def cached(arch: str) -> str:
        return os.path.join(args.cache, f"{base}.{arch}.{key}.cubin")

    made = {}
    for arch in args.arch if key else []:
        if os.path.exists(cached(arch)):
            with open(cached(arch), "rb") as f:
                made[arch] = f.read()
            print(f"[build_fatbin] {base} ({arch}): from the cache, {cached(arch)}", file=sys.stderr)
    todo = [arch for arch in args.arch if arch not in made]
    made.update(compile_all(args.nvrtc, text, base + ".cu", todo, options))
    for arch in todo if key else []:
        _write(cached(arch), made[arch])
    nvfatbin = _load_nvfatbin(args.nvfatbin)
    cubins = []
    for arch in args.arch:
        cubins.append((f"{base}.{arch}", arch, made[arch]))
        if args.keep_cubins:
            os.makedirs(args.keep_cubins, exist_ok=True)
            with open(os.path.join(args.keep_cubins, f"{base}.{arch}.cubin"), "wb") as f:
                f.write(made[arch])
    _write(args.output, pack_fatbin(nvfatbin, cubins))
    return 0


def _write(path: str, data: bytes) -> None:
    """Whole or not at all: a build stopped halfway leaves no truncated file (above all in the cache)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ToolError as exc:
        print(f"build_fatbin: {exc}", file=sys.stderr)
        sys.exit(1)
