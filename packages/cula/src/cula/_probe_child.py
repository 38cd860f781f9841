"""Runs in a short-lived child process (see _probe.py): asks libcuda.so.1 about the driver and
the GPUs and prints one JSON object. Initialising CUDA here keeps the user's process free of a
CUDA context, so it can still fork and use CUDA afterwards. Standard library only."""

import ctypes
import json
import os
import re


def _driver_release(libcuda_path):
    try:
        with open("/proc/driver/nvidia/version", encoding="ascii", errors="replace") as f:
            m = re.search(r"Kernel Module(?: for \w+)?\s+([0-9][0-9.]+)", f.read())
            if m:
                return m.group(1)
    except OSError:
        pass
    m = re.search(r"libcuda\.so\.([0-9][0-9.]+)$", os.path.realpath(libcuda_path or ""))
    return m.group(1) if m else None


def _loaded_path(name):
    try:
        with open("/proc/self/maps", encoding="ascii", errors="replace") as f:
            for line in f:
                path = line.split()[-1]
                if os.path.basename(path).startswith(name):
                    return path
    except OSError:
        pass
    return None


def main():
    out = {"libcuda": None, "driver_version": None, "driver_release": None, "error": None, "gpus": []}
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        out["error"] = f"libcuda.so.1 could not be loaded ({exc})"
        return out
    out["libcuda"] = _loaded_path("libcuda.so")
    out["driver_release"] = _driver_release(out["libcuda"])
    c_int_p = ctypes.POINTER(ctypes.c_int)
    lib.cuInit.argtypes = [ctypes.c_uint]
    lib.cuDriverGetVersion.argtypes = [c_int_p]
    lib.cuDeviceGetCount.argtypes = [c_int_p]
    lib.cuDeviceGet.argtypes = [c_int_p, ctypes.c_int]
    lib.cuDeviceGetAttribute.argtypes = [c_int_p, ctypes.c_int, ctypes.c_int]
    lib.cuDeviceGetName.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
    for fn in (lib.cuInit, lib.cuDriverGetVersion, lib.cuDeviceGetCount, lib.cuDeviceGet,
               lib.cuDeviceGetAttribute, lib.cuDeviceGetName):
        fn.restype = ctypes.c_int

    def err(rc, what):
        name = ctypes.c_char_p()
        try:
            lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
            lib.cuGetErrorName.restype = ctypes.c_int
            if lib.cuGetErrorName(rc, ctypes.byref(name)) == 0 and name.value:
                return f"{what} failed: {name.value.decode()} ({rc})"
        except AttributeError:
            pass
        return f"{what} failed: CUDA error {rc}"

    version = ctypes.c_int()
    rc = lib.cuDriverGetVersion(ctypes.byref(version))
    if rc == 0:
        out["driver_version"] = version.value
    rc = lib.cuInit(0)
    if rc != 0:
        out["error"] = err(rc, "cuInit")
        return out
    count = ctypes.c_int()
    rc = lib.cuDeviceGetCount(ctypes.byref(count))
    if rc != 0:
        out["error"] = err(rc, "cuDeviceGetCount")
        return out
    for i in range(count.value):
        dev = ctypes.c_int()
        major = ctypes.c_int()
        minor = ctypes.c_int()
        name = ctypes.create_string_buffer(256)
        for rc, what in (
            (lib.cuDeviceGet(ctypes.byref(dev), i), "cuDeviceGet"),
            (lib.cuDeviceGetAttribute(ctypes.byref(major), 75, dev.value), "cuDeviceGetAttribute(CC major)"),
            (lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev.value), "cuDeviceGetAttribute(CC minor)"),
            (lib.cuDeviceGetName(name, 256, dev.value), "cuDeviceGetName"),
        ):
            if rc != 0:
                out["error"] = err(rc, f"{what} for device {i}")
                return out
        out["gpus"].append({"index": i, "name": name.value.decode(errors="replace"),
                            "cc": [major.value, minor.value]})
    return out


if __name__ == "__main__":
    print(json.dumps(main()))
