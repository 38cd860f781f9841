"""Compile CUDA sources to SASS with NVRTC and pack the cubins into one fatbin with nvFatbin.

Used by native/CMakeLists.txt at build time. It needs only the NVIDIA pip wheels
(libnvrtc, libnvfatbin), never a CUDA toolkit, and embeds no PTX: a PTX-free fatbin
keeps CUDA minor-version compatibility (the driver never JIT-compiles anything).

    python build_fatbin.py --nvrtc LIB --nvfatbin LIB --arch sm_90a --arch sm_100f \
        -I DIR -o cula_kernels.fatbin family1.cu family2.cu

The sources are compiled as one program (one cubin per target, named after the output).
"""

from __future__ import annotations

import argparse
import ctypes
import glob
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
        if text:
            print(f"[build_fatbin] {name} ({arch}):\n{text}", file=sys.stderr)
        size = ctypes.c_size_t()
        check(nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
        buf = ctypes.create_string_buffer(size.value)
        check(nvrtc.nvrtcGetCUBIN(prog, buf), "nvrtcGetCUBIN")
        return buf.raw
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nvrtc", required=True, help="path to libnvrtc.so.NN")
    parser.add_argument("--nvfatbin", required=True, help="path to libnvfatbin.so.NN")
    parser.add_argument("--arch", action="append", required=True, help="real target, e.g. sm_90a, sm_100f")
    parser.add_argument("-I", dest="includes", action="append", default=[], help="include directory")
    parser.add_argument("-D", dest="defines", action="append", default=[], help="preprocessor define")
    parser.add_argument("--keep-cubins", help="also write each cubin into this directory")
    parser.add_argument("--lineinfo", action="store_true",
                        help="with source line information, for profiles (the same SASS; never for release builds)")
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("sources", nargs="+")
    args = parser.parse_args(argv)

    nvrtc = _load_nvrtc(args.nvrtc)
    nvfatbin = _load_nvfatbin(args.nvfatbin)
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
    cubins = []
    for arch in args.arch:
        cubin = compile_cubin(nvrtc, text, base + ".cu", arch, options)
        cubins.append((f"{base}.{arch}", arch, cubin))
        if args.keep_cubins:
            os.makedirs(args.keep_cubins, exist_ok=True)
            with open(os.path.join(args.keep_cubins, f"{base}.{arch}.cubin"), "wb") as f:
                f.write(cubin)
    fatbin = pack_fatbin(nvfatbin, cubins)
    tmp = args.output + ".tmp"
    with open(tmp, "wb") as f:
        f.write(fatbin)
    os.replace(tmp, args.output)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ToolError as exc:
        print(f"build_fatbin: {exc}", file=sys.stderr)
        sys.exit(1)
