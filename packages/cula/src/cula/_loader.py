"""Choosing and loading a CUDA backend (cula_cu13 or cula_cu12).

Order of choice: ``CULA_BACKEND`` (cu12 / cu13) if set; else the only backend installed; else,
with both installed, the CUDA major of an installed PyTorch (two libcudart majors in one process
break some libraries) if the driver can run it, then the driver's CUDA major, then the newest.

Loading checks, all reported together in one error: the backend's version equals cula's, its
libcudart can be found (the extension's RUNPATH points into site-packages/nvidia/...; when that
finds nothing, the same places cuda-pathfinder searches are tried for this major), and, at the
first call on a device, that the driver is new enough and the GPU is one the fat binary has
code for. ``CULA_SKIP_CHECKS=1`` skips the version and driver checks.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import importlib.util
import os
import re
import sys
import warnings
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType

from . import _probe
from ._version import __version__

__all__ = ["BACKENDS", "Backend", "BackendError", "CulaBackendWarning", "backend", "install_command"]

BACKENDS = ("cu13", "cu12")  # tried newest first
_RUNTIME_WHEEL_DIR = {12: "cuda_runtime/lib", 13: "cu13/lib"}
_RUNTIME_PACKAGE = {12: "nvidia-cuda-runtime-cu12", 13: "nvidia-cuda-runtime"}
_MIN_DRIVER_RELEASE = {12: "525.60.13", 13: "580.65.06"}


class BackendError(RuntimeError):
    """No usable CUDA backend: the message says what was found and the command that fixes it."""


class CulaBackendWarning(UserWarning):
    """Emitted once by ``import cula`` when no usable CUDA backend is installed."""


@dataclass
class Backend:
    name: str                     # "cu12" / "cu13"
    module: ModuleType            # cula_cuNN._C
    reason: str                   # why this backend was chosen
    runtime_found_via: str        # "RUNPATH (wheel)" or where the fallback found libcudart
    checked_devices: dict = field(default_factory=dict)

    @property
    def major(self) -> int:
        return int(self.name[2:])

    @property
    def path(self) -> str:
        return self.module.__file__


def _skip_checks() -> bool:
    return os.environ.get("CULA_SKIP_CHECKS", "").strip().lower() in ("1", "true", "yes", "on")


def installed_backends() -> list[str]:
    return [b for b in BACKENDS if importlib.util.find_spec(f"cula_{b}") is not None]


def torch_cuda_major() -> int | None:
    """CUDA major of the installed PyTorch, read without importing torch when it is not imported."""
    torch = sys.modules.get("torch")
    if torch is not None:
        cuda = getattr(getattr(torch, "version", None), "cuda", None)
    else:
        spec = importlib.util.find_spec("torch")
        if spec is None or not spec.submodule_search_locations:
            return None
        try:
            with open(os.path.join(list(spec.submodule_search_locations)[0], "version.py"), encoding="utf-8") as f:
                m = re.search(r"^cuda\s*(?::\s*\S+)?\s*=\s*['\"]([0-9.]+)['\"]", f.read(), re.M)
                cuda = m.group(1) if m else None
        except OSError:
            cuda = None
    try:
        return int(str(cuda).split(".")[0]) if cuda else None
    except ValueError:
        return None


def recommended_backend(probe: _probe.ProbeResult | None, torch_major: int | None) -> str | None:
    """Which backend this machine should run, or None when its driver can run neither."""
    driver_major = probe.cuda_major if probe is not None else None
    if driver_major is None:
        return f"cu{torch_major}" if torch_major in (12, 13) else "cu13"
    if torch_major in (12, 13) and torch_major <= driver_major:
        return f"cu{torch_major}"
    if driver_major >= 13:
        return "cu13"
    if driver_major == 12:
        return "cu12"
    return None


def install_command(name: str) -> str:
    return f'pip install "cula[{name}]=={__version__}"'


def _safe_probe() -> _probe.ProbeResult | None:
    try:
        return _probe.probe()
    except _probe.ProbeError:
        return None


def _advice(probe: _probe.ProbeResult | None) -> str:
    """The probe's view of the machine and the command to run."""
    torch_major = torch_cuda_major()
    seen = probe.describe() if probe is not None else "The driver probe could not run"
    if probe is not None and probe.driver_found and probe.cuda_major is not None and probe.cuda_major < 12:
        return (f"{seen}. cula needs a driver for CUDA 12 or newer (release {_MIN_DRIVER_RELEASE[12]}+ for "
                f"cula[cu12], {_MIN_DRIVER_RELEASE[13]}+ for cula[cu13]): update the NVIDIA driver, then run: "
                f"{install_command('cu13')}")
    rec = recommended_backend(probe, torch_major)
    torch_note = f" (matches PyTorch's CUDA {torch_major})" if rec == f"cu{torch_major}" else ""
    return f"{seen}. Run: {install_command(rec)}{torch_note}"


def _preload_runtime(major: int) -> str | None:
    """Find and load libcudart.so.<major> the way cuda-pathfinder searches, restricted to this
    major: already loaded, NVIDIA wheels in site-packages, conda, the system loader, CUDA_PATH /
    CUDA_HOME. Returns how it was found, or None."""
    soname = f"libcudart.so.{major}"
    try:
        ctypes.CDLL(soname, mode=os.RTLD_NOLOAD | ctypes.RTLD_GLOBAL)
        return f"already loaded in the process ({soname})"
    except OSError:
        pass
    candidates = []
    for entry in sys.path:
        candidates.append(("site-packages", os.path.join(entry, "nvidia", _RUNTIME_WHEEL_DIR[major], soname)))
    if os.environ.get("CONDA_PREFIX"):
        candidates.append(("conda", os.path.join(os.environ["CONDA_PREFIX"], "lib", soname)))
    candidates.append(("system loader", soname))
    for var in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(var):
            for sub in ("lib64", "lib"):
                candidates.append((var, os.path.join(os.environ[var], sub, soname)))
    for how, path in candidates:
        if os.sep in path and not os.path.exists(path):
            continue
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        return f"{how}: {path}"
    return None


def _load(name: str, reason: str) -> Backend:
    major = int(name[2:])
    problems = []
    found_via = "RUNPATH (NVIDIA runtime wheel)"
    try:
        module = importlib.import_module(f"cula_{name}._C")
    except ImportError as exc:
        if f"libcudart.so.{major}" not in str(exc):
            raise BackendError(f"cula: the cula-{name} backend failed to import: {exc}") from exc
        found_via = _preload_runtime(major)
        module = None
        if found_via is not None:
            try:
                module = importlib.import_module(f"cula_{name}._C")
            except ImportError as exc2:
                problems.append(f"cula-{name} could not load the libcudart.so.{major} found ({found_via}): {exc2}")
        else:
            problems.append(
                f"cula-{name} needs libcudart.so.{major}, and none was found (not in site-packages/nvidia, "
                f"conda, the system loader path or CUDA_PATH/CUDA_HOME). Fix: pip install "
                f"\"{_RUNTIME_PACKAGE[major]}>={major}\" (or reinstall with: {install_command(name)})")
    # The backend's version: from the extension when it loaded, else from its metadata.
    try:
        backend_version = module.__version__ if module is not None else metadata.version(f"cula-{name}")
    except metadata.PackageNotFoundError:
        backend_version = __version__
    if backend_version != __version__ and not _skip_checks():
        problems.append(
            f"version skew: cula {__version__} but cula-{name} {backend_version}. Fix: {install_command(name)} "
            "(or set CULA_SKIP_CHECKS=1 to use them anyway)")
    if problems:
        raise BackendError("cula: the CUDA backend cannot be used:\n  - " + "\n  - ".join(problems))
    if found_via.startswith("RUNPATH"):
        # The SONAME may already have been loaded by another library (PyTorch, say) from elsewhere.
        wheel_lib = os.path.join(os.path.dirname(module.__file__), "..", "nvidia", _RUNTIME_WHEEL_DIR[major],
                                 f"libcudart.so.{major}")
        if os.path.realpath(module.runtime_library_path()) != os.path.realpath(wheel_lib):
            found_via = "already loaded in this process by another library (same SONAME)"
    return Backend(name, module, reason, found_via)


def _choose() -> tuple[str | None, str]:
    forced = os.environ.get("CULA_BACKEND", "").strip()
    installed = installed_backends()
    if forced:
        if forced not in BACKENDS:
            raise BackendError(f"cula: CULA_BACKEND={forced!r} is not valid; expected one of {', '.join(BACKENDS)}")
        if forced not in installed:
            raise BackendError(f"cula: CULA_BACKEND={forced} but cula-{forced} is not installed. "
                               f"Run: {install_command(forced)}")
        return forced, "CULA_BACKEND"
    if not installed:
        return None, "none installed"
    if len(installed) == 1:
        return installed[0], "only backend installed"
    torch_major = torch_cuda_major()
    probe = _safe_probe()
    rec = recommended_backend(probe, torch_major)
    if rec in installed:
        if rec == f"cu{torch_major}":
            return rec, f"matches PyTorch's CUDA {torch_major}"
        if probe is not None and probe.cuda_major is not None:
            return rec, f"driver supports CUDA {probe.cuda_version_text}"
    return installed[0], "newest installed"


@functools.cache
def _state() -> Backend | BackendError:
    try:
        name, reason = _choose()
        if name is None:
            return BackendError(f"cula: no CUDA backend installed. {_advice(_safe_probe())}")
        return _load(name, reason)
    except BackendError as exc:
        return exc


def backend() -> Backend:
    """The loaded backend; raises BackendError (with the fix) when there is none."""
    state = _state()
    if isinstance(state, BackendError):
        raise BackendError(str(state))
    return state


def warn_if_unusable() -> None:
    """Called by ``import cula``: one warning when no backend can be used."""
    state = _state()
    if isinstance(state, BackendError):
        warnings.warn(str(state), CulaBackendWarning, stacklevel=3)


def check_device(b: Backend, device: int) -> str:
    """Once per device: driver new enough, GPU supported. Returns the device's kernel variant,
    "sm90a" or "generic" (the launches run the generic kernels when CULA_FORCE_GENERIC=1)."""
    variant = b.checked_devices.get(device)
    if variant is None:
        if not _skip_checks():
            driver = b.module.driver_version()
            if driver < b.major * 1000:
                have = f"CUDA {driver // 1000}.{driver % 1000 // 10}" if driver else "no CUDA driver"
                release = _MIN_DRIVER_RELEASE.get(b.major)
                fix = ("update the NVIDIA driver" + (f" to release {release} or newer" if release else "")
                       + (f", or use the CUDA 12 backend: {install_command('cu12')}" if b.major == 13 and
                          driver >= 12000 else ""))
                raise BackendError(f"cula: the driver supports {have}, but cula-{b.name} needs CUDA "
                                   f"{b.major}.0 or newer: {fix}")
        cc = tuple(b.module.device_capability(device))
        target = _probe.SUPPORTED_CC.get(cc)
        if target is None:
            raise BackendError(
                f"cula: GPU {device} has compute capability {cc[0]}.{cc[1]} (sm_{cc[0]}{cc[1]}), which this build "
                f"of cula does not support. Supported: {_probe.SUPPORTED_ARCHS_TEXT} "
                f"(fat binary targets: {', '.join(b.module.ARCHS)})")
        variant = "sm90a" if target == "sm_90a" else "generic"
        b.checked_devices[device] = variant
    return variant
