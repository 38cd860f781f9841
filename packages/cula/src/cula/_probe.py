"""What the machine offers: the NVIDIA driver and the GPUs, read through libcuda.so.1.

The reading happens in a short-lived child process (``_probe_child.py``) so that the calling
process never initialises CUDA; the result is cached for the life of the process.
``CUDA_VISIBLE_DEVICES`` applies, as in any CUDA program.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from dataclasses import dataclass

__all__ = ["SUPPORTED_CC", "Gpu", "ProbeError", "ProbeResult", "probe"]

# Compute capabilities the fat binary has SASS for: sm_90a (H100/H200/GH200) and the sm_100
# family (sm_100f: B200/GB200 = 10.0, B300/GB300 = 10.3).
SUPPORTED_CC = {(9, 0): "sm_90a", (10, 0): "sm_100f", (10, 3): "sm_100f"}
SUPPORTED_ARCHS_TEXT = "sm_90 (H100, H200, GH200), sm_100 (B200, GB200) and sm_103 (B300, GB300)"


class ProbeError(RuntimeError):
    """The probe child process could not run or answered nonsense."""


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    cc: tuple[int, int]

    @property
    def arch(self) -> str:
        return f"sm_{self.cc[0]}{self.cc[1]}"

    @property
    def supported(self) -> bool:
        return self.cc in SUPPORTED_CC

    def describe(self) -> str:
        status = "supported" if self.supported else "not supported by cula"
        return f"GPU {self.index} {self.name} ({self.arch}, {status})"


@dataclass(frozen=True)
class ProbeResult:
    libcuda: str | None           # path of the libcuda.so.1 that was loaded, or None
    driver_version: int | None    # CUDA version the driver supports, e.g. 13000
    driver_release: str | None    # e.g. "580.159.03"
    error: str | None             # why the driver could not be used, if it could not
    gpus: tuple[Gpu, ...]

    @property
    def driver_found(self) -> bool:
        return self.libcuda is not None

    @property
    def cuda_major(self) -> int | None:
        return None if self.driver_version is None else self.driver_version // 1000

    @property
    def cuda_version_text(self) -> str | None:
        if self.driver_version is None:
            return None
        return f"{self.driver_version // 1000}.{self.driver_version % 1000 // 10}"

    def describe(self) -> str:
        """One line, e.g. 'Driver 580.159.03 (CUDA 13.0); GPU 0 NVIDIA H200 (sm_90, supported)'."""
        if not self.driver_found:
            return "No NVIDIA driver found (libcuda.so.1 is not loadable)"
        release = f"Driver {self.driver_release}" if self.driver_release else "NVIDIA driver"
        parts = [f"{release} (CUDA {self.cuda_version_text})" if self.driver_version else release]
        if self.error:
            parts.append(self.error)
        elif not self.gpus:
            parts.append("no GPU visible" + (" (CUDA_VISIBLE_DEVICES="
                                               f"{os.environ['CUDA_VISIBLE_DEVICES']!r})"
                                               if "CUDA_VISIBLE_DEVICES" in os.environ else ""))
        parts += [g.describe() for g in self.gpus]
        return "; ".join(parts)


def _parse(data: dict) -> ProbeResult:
    try:
        gpus = tuple(Gpu(int(g["index"]), str(g["name"]), (int(g["cc"][0]), int(g["cc"][1])))
                     for g in data["gpus"])
        return ProbeResult(data["libcuda"], data["driver_version"], data["driver_release"], data["error"], gpus)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ProbeError(f"cula: unexpected answer from the driver probe: {data!r}") from exc


@functools.cache
def probe() -> ProbeResult:
    """Read the driver and the GPUs in a child process (once per process)."""
    child = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_probe_child.py")
    try:
        proc = subprocess.run([sys.executable, "-I", "-S", child], capture_output=True, text=True, timeout=60,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ProbeError(f"cula: the driver probe could not run: {exc}") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise ProbeError(f"cula: the driver probe exited with status {proc.returncode}: {' | '.join(tail)}")
    try:
        return _parse(json.loads(proc.stdout))
    except json.JSONDecodeError as exc:
        raise ProbeError(f"cula: the driver probe printed no JSON: {proc.stdout[:200]!r}") from exc
