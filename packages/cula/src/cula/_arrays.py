"""A thin view of the arrays cula accepts: torch tensors, CuPy arrays, and any other CUDA array
that speaks DLPack (``__dlpack__`` / ``__dlpack_device__``) and the array API (for allocating
outputs). Outputs are allocated with the input's own library, on its device; launches go on
that library's current stream."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

__all__ = ["Array", "view"]

_KDLCUDA = 2
_DLPACK_DTYPES = {(4, 16): "bfloat16", (2, 16): "float16", (2, 32): "float32", (2, 64): "float64",
                  (0, 32): "int32", (0, 64): "int64"}


class Array:
    """What cula needs to know of an input array. Built on every call of every op, so it is a
    plain slotted class and computes the text for messages only when one is raised."""

    __slots__ = ("obj", "kind", "shape", "dtype", "device", "contiguous", "_ptr", "_ptr_value", "_device_text",
                 "_strides")

    def __init__(self, obj: Any, kind: str, shape: tuple[int, ...], dtype: str, device: int | None,
                 device_text: str | None, contiguous: bool, ptr: Callable[[], int],
                 strides: Callable[[], tuple[int, ...]] | None = None) -> None:
        self.obj = obj
        self.kind = kind                # "torch" | "cupy" | "dlpack"
        self.shape = shape
        self.dtype = dtype              # numpy-style name: "bfloat16", "float16", "float32", "int32", ...
        self.device = device            # CUDA ordinal, None when not a CUDA array
        self._device_text = device_text
        self.contiguous = contiguous
        self._ptr = ptr
        self._ptr_value: int | None = None
        self._strides = strides

    @property
    def device_text(self) -> str:
        """For messages: "cuda:0", "cpu", ..."""
        if self._device_text is None:
            self._device_text = str(self.obj.device)
        return self._device_text

    @property
    def ptr(self) -> int:
        """The data address (asked of the library once)."""
        if self._ptr_value is None:
            self._ptr_value = self._ptr()
        return self._ptr_value

    def strides(self) -> tuple[int, ...]:
        """The strides in elements (asked of the library: only where a layout other than contiguous
        is taken)."""
        if self._strides is not None:
            return tuple(self._strides())
        out, step = [], 1  # (an array whose library says nothing of strides: contiguous ones only)
        for n in reversed(self.shape):
            out.append(step)
            step *= n
        return tuple(reversed(out))

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
            return self.obj.new_empty(shape, dtype=getattr(sys.modules["torch"], dtype))
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
            return _torch_stream(self.device)
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


_TORCH_DTYPES: dict = {}  # torch.dtype -> numpy-style name


def _torch_view(x: Any) -> Array:
    dtype = _TORCH_DTYPES.get(x.dtype)
    if dtype is None:
        dtype = _TORCH_DTYPES[x.dtype] = str(x.dtype).removeprefix("torch.")
    return Array(x, "torch", x.shape, dtype, x.get_device() if x.is_cuda else None, None, x.is_contiguous(),
                 x.data_ptr, x.stride)


def _torch_stream(device: int) -> int:
    """torch's current stream on `device` as a handle. torch._C._cuda_getCurrentRawStream is what
    Triton launches on (a fraction of a microsecond); current_stream() builds a Stream object."""
    torch = sys.modules["torch"]
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(device)
    return torch.cuda.current_stream(device).cuda_stream


def _cupy_view(x: Any) -> Array:
    return Array(x, "cupy", tuple(x.shape), x.dtype.name, x.device.id, f"cuda:{x.device.id}",
                 bool(x.flags.c_contiguous), lambda: x.data.ptr, lambda: tuple(s // x.itemsize for s in x.strides))


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
    return Array(x, "dlpack", tuple(shape), dtype, int(dev_id), f"cuda:{dev_id}", contiguous, lambda: ptr,
                 lambda: tuple(strides))


def view(x: Any, name: str) -> Array:
    """Wrap `x`; raises TypeError naming the argument when it is not an array cula can read."""
    if type(x) is Array:
        return x
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
