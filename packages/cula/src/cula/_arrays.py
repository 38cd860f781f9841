"""A thin view of the arrays cula accepts: torch tensors, CuPy arrays, and any other CUDA array
that speaks DLPack (``__dlpack__`` / ``__dlpack_device__``) and the array API (for allocating
outputs). Outputs are allocated with the input's own library, on its device; launches go on
that library's current stream."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Array", "view"]

_KDLCUDA = 2
_DLPACK_DTYPES = {(4, 16): "bfloat16", (2, 16): "float16", (2, 32): "float32", (2, 64): "float64",
                  (0, 32): "int32", (0, 64): "int64"}


@dataclass
class Array:
    obj: Any
    kind: str                      # "torch" | "cupy" | "dlpack"
    shape: tuple[int, ...]
    dtype: str                     # numpy-style name: "bfloat16", "float16", "float32", "int32", ...
    device: int | None             # CUDA ordinal, None when not a CUDA array
    device_text: str               # for messages: "cuda:0", "cpu", ...
    contiguous: bool
    _ptr: Callable[[], int]

    @property
    def ptr(self) -> int:
        return self._ptr()

    def contiguous_copy(self) -> Array:
        if self.kind == "torch":
            torch = sys.modules["torch"]
            return view(self.obj.clone(memory_format=torch.contiguous_format), "")
        if self.kind == "cupy":
            import cupy
            return view(cupy.array(self.obj, copy=True, order="C"), "")
        xp = self.obj.__array_namespace__()
        return view(xp.asarray(self.obj, copy=True), "")

    def empty(self, shape: tuple[int, ...], dtype: str) -> Any:
        """A new array of the input's library, on the input's device."""
        if self.kind == "torch":
            torch = sys.modules["torch"]
            return torch.empty(shape, dtype=getattr(torch, dtype), device=self.obj.device)
        if self.kind == "cupy":
            import cupy
            with cupy.cuda.Device(self.device):
                return cupy.empty(shape, dtype=dtype)
        xp = self.obj.__array_namespace__()
        return xp.empty(shape, dtype=getattr(xp, dtype), device=self.obj.device)

    def full(self, shape: tuple[int, ...], dtype: str, values: list[float]) -> Any:
        """A small array holding `values` (host data copied to the input's device)."""
        if self.kind == "torch":
            torch = sys.modules["torch"]
            return torch.tensor(values, dtype=getattr(torch, dtype), device=self.obj.device).reshape(shape)
        if self.kind == "cupy":
            import cupy
            with cupy.cuda.Device(self.device):
                return cupy.asarray(values, dtype=dtype).reshape(shape)
        xp = self.obj.__array_namespace__()
        return xp.reshape(xp.asarray(values, dtype=getattr(xp, dtype), device=self.obj.device), shape)

    def stream(self) -> int:
        """Handle of the library's current stream on this array's device."""
        if self.kind == "torch":
            return sys.modules["torch"].cuda.current_stream(self.obj.device).cuda_stream
        if self.kind == "cupy":
            import cupy
            with cupy.cuda.Device(self.device):
                return cupy.cuda.get_current_stream().ptr
        # Other libraries: the legacy default stream, which the producer was asked to sync with
        # (__dlpack__(stream=1)); the op waits for it before returning (see ops._finish).
        return 0

    def to_host_list(self) -> list:
        if self.kind == "torch":
            return self.obj.tolist()
        if self.kind == "cupy":
            return self.obj.get().tolist()
        import numpy as np
        return np.asarray(self.obj).tolist()


def _torch_view(x: Any) -> Array:
    torch = sys.modules["torch"]
    dev = x.device
    dtype = str(x.dtype).removeprefix("torch.")
    return Array(x, "torch", tuple(x.shape), dtype, dev.index if dev.type == "cuda" else None, str(dev),
                 x.is_contiguous(), x.data_ptr) if isinstance(x, torch.Tensor) else None


def _cupy_view(x: Any) -> Array:
    return Array(x, "cupy", tuple(x.shape), x.dtype.name, x.device.id, f"cuda:{x.device.id}",
                 bool(x.flags.c_contiguous), lambda: x.data.ptr)


def _dlpack_view(x: Any, name: str) -> Array:
    dev_type, dev_id = x.__dlpack_device__()
    if dev_type != _KDLCUDA:
        text = {1: "cpu", 3: "cuda_host", 13: "cuda_managed"}.get(int(dev_type), f"DLPack device {int(dev_type)}")
        return Array(x, "dlpack", tuple(getattr(x, "shape", ())), str(getattr(x, "dtype", "?")), None, text,
                     True, lambda: 0)
    from ._loader import backend
    ptr, _, _, (code, bits, lanes), shape, strides, _ = backend().module.dlpack_view(x.__dlpack__(stream=1))
    dtype = _DLPACK_DTYPES.get((code, bits), f"dlpack(code={code}, bits={bits})") if lanes == 1 else "vector"
    expect, contiguous = 1, True
    for n, s in zip(reversed(shape), reversed(strides), strict=True):
        if n != 1 and s != expect:
            contiguous = False
        expect *= n
    return Array(x, "dlpack", tuple(shape), dtype, int(dev_id), f"cuda:{dev_id}", contiguous, lambda: ptr)


def view(x: Any, name: str) -> Array:
    """Wrap `x`; raises TypeError naming the argument when it is not an array cula can read."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return _torch_view(x)
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(x, cupy.ndarray):
        return _cupy_view(x)
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        return _dlpack_view(x, name)
    raise TypeError(f"cula: {name} must be a CUDA array (torch.Tensor, cupy.ndarray or any array with "
                    f"__dlpack__), got {type(x).__module__}.{type(x).__qualname__}")
