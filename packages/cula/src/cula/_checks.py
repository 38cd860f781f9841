"""Argument checks shared by every op. Each failure raises before any launch, naming the
argument, what was expected and what was given. Non-contiguous (or misaligned) inputs are
copied, as FLA does; arrays that an op writes in place are never copied, so those are rejected."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from typing import Any

from ._arrays import Array, view

__all__ = ["HEAD_DIMS", "INPUT_DTYPES", "MAX_SEQUENCES", "SCALAR_DTYPES", "check_cache", "check_flag", "check_float",
           "check_g_gamma", "check_gva_inputs", "check_head_param", "check_indices", "check_inputs", "check_no_grad",
           "check_out", "check_parents", "check_pool", "check_scale", "check_seqlens", "check_sequence_count",
           "check_state", "check_token_scalars", "checks_off", "prepare", "prepare_rows", "run_later", "same_device",
           "seq_args"]

INPUT_DTYPES = ("bfloat16", "float16")
HEAD_DIMS = (64, 128)
_ALIGN = 16


def _shape(a: Array) -> str:
    return "[" + ", ".join(str(s) for s in a.shape) + "]"


def check_inputs(q: Any, k: Any, v: Any, ndim: int, layout: str) -> tuple[Array, Array, Array]:
    """q, k: [..., H, K]; v: [..., H, V]; same dtype (bf16/fp16), K = V in HEAD_DIMS."""
    qa, ka, va = view(q, "q"), view(k, "k"), view(v, "v")
    kinds = {qa.kind, ka.kind, va.kind}
    if len(kinds) != 1:
        raise TypeError(f"cula: q, k and v must come from one array library, got {qa.kind}, {ka.kind}, {va.kind}")
    for name, a in (("q", qa), ("k", ka), ("v", va)):
        if len(a.shape) != ndim:
            raise ValueError(f"cula: {name} must have shape {layout} ({ndim} dims), got {_shape(a)}")
        if a.dtype not in INPUT_DTYPES:
            raise TypeError(f"cula: {name} must be bfloat16 or float16, got {a.dtype}")
    if not (qa.dtype == ka.dtype == va.dtype):
        raise TypeError(f"cula: q, k and v must have one dtype, got q {qa.dtype}, k {ka.dtype}, v {va.dtype}")
    if ka.shape != qa.shape:
        raise ValueError(f"cula: k must have the shape of q {_shape(qa)}, got {_shape(ka)}")
    if va.shape[:-1] != qa.shape[:-1]:
        expect = "[" + ", ".join([*(str(n) for n in qa.shape[:-1]), "V"]) + "]"
        raise ValueError(f"cula: v must have shape {expect}, matching q in all but the last dim, got {_shape(va)}")
    dk, dv = qa.shape[-1], va.shape[-1]
    if dk not in HEAD_DIMS or dv != dk:
        raise ValueError(f"cula: head dims K = V in {HEAD_DIMS} are supported, got K={dk} (q, k) and V={dv} (v)")
    return qa, ka, va


def check_gva_inputs(q: Any, k: Any, v: Any, ndim: int, layout: str) -> tuple[Array, Array, Array]:
    """q, k: [..., H, K]; v: [..., HV, V] with HV a multiple of H (grouped value heads, as FLA's
    gated delta rule takes them); otherwise as check_inputs."""
    qa, ka, va = view(q, "q"), view(k, "k"), view(v, "v")
    if len(va.shape) == ndim and len(qa.shape) == ndim and va.shape[:-2] == qa.shape[:-2]:
        hq, hv = qa.shape[-2], va.shape[-2]
        if hq < 1 or hv % hq:
            raise ValueError(f"cula: v's heads HV={hv} must be a multiple of q's heads H={hq} (grouped value heads), "
                             f"got q {_shape(qa)}, v {_shape(va)}")
        # the same checks as without grouping, on v seen with q's head count
        check_inputs(qa, ka, _with_heads(va, hq), ndim, layout)
        return qa, ka, va
    return check_inputs(qa, ka, va, ndim, layout)


def _with_heads(a: Array, heads: int) -> Array:
    return Array(a.obj, a.kind, (*a.shape[:-2], heads, a.shape[-1]), a.dtype, a.device, a._device_text, a.contiguous,
                 a._ptr)


SCALAR_DTYPES = {"float32": 0, "bfloat16": 1, "float16": 2}  # CULA_F32 / CULA_BF16 / CULA_F16


def check_token_scalars(x: Any, name: str, shape: tuple[int, ...], layout: str) -> Array:
    """A per-token, per-head input (g, beta): exactly `shape`, float32, bfloat16 or float16."""
    xa = view(x, name)
    if xa.shape != tuple(shape):
        raise ValueError(f"cula: {name} must have shape {layout} = [{', '.join(map(str, shape))}], got {_shape(xa)}")
    if xa.dtype not in SCALAR_DTYPES:
        raise TypeError(f"cula: {name} must be float32, bfloat16 or float16, got {xa.dtype}")
    return xa


def check_head_param(x: Any, name: str, heads: int, key_dim: int = 0) -> Array | None:
    """A per-head parameter (A_log, dt_bias): [HV], float32, bfloat16 or float16; with key_dim one
    per head and key (KDA's dt_bias): [HV * K] or [HV, K]."""
    if x is None:
        return None
    xa = view(x, name)
    if key_dim:
        if xa.shape not in ((heads * key_dim,), (heads, key_dim)):
            raise ValueError(f"cula: {name} must have shape [HV * K] = [{heads * key_dim}] or [HV, K] = "
                             f"[{heads}, {key_dim}], got {_shape(xa)}")
    elif xa.shape != (heads,):
        raise ValueError(f"cula: {name} must have shape [HV] = [{heads}], got {_shape(xa)}")
    if xa.dtype not in SCALAR_DTYPES:
        raise TypeError(f"cula: {name} must be float32, bfloat16 or float16, got {xa.dtype}")
    return xa


def check_flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"cula: {name} must be a bool, got {type(value).__name__}")
    return value


MAX_SEQUENCES = 65535  # sequences are a grid dimension of the launch


def check_sequence_count(n: int, what: str) -> None:
    if n > MAX_SEQUENCES:
        raise ValueError(f"cula: at most {MAX_SEQUENCES} sequences per call are supported, got {what}={n}; "
                         "split the batch")


def check_float(x: Any, name: str) -> float | None:
    """An optional finite float argument (scale, lower_bound): None or a float."""
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(f"cula: {name} must be a float or None, got {type(x).__name__}")
    if not math.isfinite(x):
        raise ValueError(f"cula: {name} must be finite, got {x}")
    return float(x)


def check_scale(scale: Any, head_dim: int) -> float:
    scale = check_float(scale, "scale")
    return head_dim ** -0.5 if scale is None else scale


def check_g_gamma(g_gamma: Any, heads: int) -> Array | None:
    if g_gamma is None:
        return None
    ga = view(g_gamma, "g_gamma")
    if ga.shape != (heads,):
        raise ValueError(f"cula: g_gamma must have shape [H] = [{heads}] (one log decay per head), got {_shape(ga)}")
    if ga.dtype != "float32":
        raise TypeError(f"cula: g_gamma must be float32, got {ga.dtype}")
    return ga


def check_state(state: Any, name: str, shape: tuple[int, ...], layout: str = "[N, H, K, V]") -> Array | None:
    """Float32 states of `shape` (shape[0] < 0: any count, "P")."""
    if state is None:
        return None
    sa = view(state, name)
    if len(sa.shape) != 4 or sa.shape[1:] != shape[1:] or (shape[0] >= 0 and sa.shape[0] != shape[0]):
        expect = "[" + ", ".join("P" if s < 0 else str(s) for s in shape) + "]"
        raise ValueError(f"cula: {name} must have shape {layout} = {expect}, got {_shape(sa)}")
    if sa.dtype != "float32":
        raise TypeError(f"cula: {name} must be float32, got {sa.dtype}")
    return sa


def check_pool(state: Any, name: str, shape: tuple[int, ...], in_place: bool,
               layout: str = "[N, H, K, V]") -> tuple[Array | None, int]:
    """A state pool (check_state's shape and dtype) and its pitch: the elements from one slot's
    [H, K, V] state to the next. Each slot must be contiguous and start 16-byte aligned, but slots
    may sit further apart than H K V, as in vLLM's pools, whose slots share pages with other
    state (its `as_strided` views: one stride for the slots, the state's own inside). A pool of
    another layout is copied when only read, and refused when written in place."""
    sa = check_state(state, name, shape, layout)
    if sa is None:
        return None, 0
    inner = sa.shape[1] * sa.shape[2] * sa.shape[3]
    if sa.contiguous and sa.ptr % _ALIGN == 0:
        return sa, inner
    strides = sa.strides()
    pitch = strides[0] if sa.shape[0] > 1 else inner
    dense = (sa.shape[2] * sa.shape[3], sa.shape[3], 1)  # (a slot's strides when contiguous)
    slots_ok = all(st == want for n, st, want in zip(sa.shape[1:], strides[1:], dense, strict=True) if n > 1)
    if slots_ok and pitch >= inner and pitch % 4 == 0 and sa.ptr % _ALIGN == 0:
        return sa, pitch
    if in_place:
        slot = "[" + ", ".join(map(str, sa.shape[1:])) + "]"
        raise ValueError(f"cula: {name} is updated in place, so each of its {slot} states must be contiguous and "
                         "16-byte aligned, the next one a multiple of 4 elements (16 bytes) further and no nearer than "
                         f"its size; got strides ({', '.join(map(str, strides))})")
    return sa.contiguous_copy(), inner


def check_out(out: Any, like: Array) -> Array:
    """An output buffer the op writes in place: the shape and dtype of `like`, same library,
    contiguous and 16-byte aligned (never copied)."""
    oa = view(out, "out")
    if oa.kind != like.kind:
        raise TypeError(f"cula: out must come from the inputs' array library ({like.kind}), got {oa.kind}")
    if oa.shape != like.shape:
        raise ValueError(f"cula: out must have the shape of v {_shape(like)}, got {_shape(oa)}")
    if oa.dtype != like.dtype:
        raise TypeError(f"cula: out must have the dtype of v ({like.dtype}), got {oa.dtype}")
    if not oa.contiguous or oa.ptr % _ALIGN:
        raise ValueError("cula: out is written in place, so it must be contiguous and 16-byte aligned")
    return oa


def check_seqlens(cu_seqlens: Any, batch: int, total: int, host_copy: Any = None,
                  later: list | None = None, longest: list | None = None,
                  check_values: bool = True) -> tuple[Array, int, bool]:
    """Validates cu_seqlens ([N+1], int32/int64, 0 = c0 <= c1 <= ... <= cN = T); returns (array, N,
    one): `one` when N = 1 and the values are checked, so that they must be [0, T] (see seq_args).
    The values are read from `host_copy` (FLA's cu_seqlens_cpu) when given, else copied to the host
    (by run_later, given `later`); without check_values (values_unchecked: the kernels clamp them)
    only from a host copy. The check extends `longest` by the longest sequence's tokens, its index (the
    first of that length), its first row and the longest of the other sequences' tokens."""
    ca = view(cu_seqlens, "cu_seqlens")
    if len(ca.shape) != 1 or ca.shape[0] < 2:
        raise ValueError(f"cula: cu_seqlens must have shape [N+1] with N >= 1, got {_shape(ca)}")
    if ca.dtype not in ("int32", "int64"):
        raise TypeError(f"cula: cu_seqlens must be int32 or int64, got {ca.dtype}")
    if batch != 1:
        raise ValueError(f"cula: with cu_seqlens the batch size must be 1 (sequences packed along T), got B={batch}")
    hc = None
    if host_copy is not None:
        hc = view(host_copy, "cu_seqlens_cpu")
        if hc.shape != ca.shape:
            raise ValueError(f"cula: cu_seqlens_cpu must have the shape of cu_seqlens {_shape(ca)}, got {_shape(hc)}")
    checked = hc is not None or check_values
    if checked:
        values = ca if hc is None else hc
        _check_values(later, values, lambda: _seqlens_values(values, total, longest))
    return ca, ca.shape[0] - 1, checked and ca.shape[0] == 2


def seq_args(ca: Array | None, nseq: int, total: int, one: bool) -> tuple[int, bool, int, int]:
    """The sequences as the kernels take them: (cu_seqlens' address, int64, N, tokens a sequence).
    Fixed-length (0, False, B, T) without cu_seqlens, and also for one sequence whose cu_seqlens
    the host checks (check_seqlens' `one`): they hold [0, T] or the op raises before its launch,
    and the kernels then treat the call as B = 1, among them the split of one long prompt, which
    engines pass as a varlen call. Else (address, int64, N, 0): the kernels read cu_seqlens."""
    if ca is None or one:
        return 0, False, nseq, total
    return ca.ptr, ca.dtype == "int64", nseq, 0


def _seqlens_values(a: Array, total: int, longest: list | None) -> None:
    values = a.to_host_list()
    if values[0] != 0:
        raise ValueError(f"cula: cu_seqlens must start at 0, got {values[0]}")
    most, at, second = 0, 0, 0
    for i in range(1, len(values)):
        n = values[i] - values[i - 1]
        if n < 0:
            raise ValueError(f"cula: cu_seqlens must be non-decreasing, got cu_seqlens[{i - 1}]={values[i - 1]} > "
                             f"cu_seqlens[{i}]={values[i]}")
        if n > most:
            most, at, second = n, i - 1, most
        elif n > second:
            second = n
    if values[-1] != total:
        raise ValueError(f"cula: cu_seqlens[-1] must equal the number of tokens T={total}, got {values[-1]}")
    if longest is not None:
        longest.extend((most, at, values[at], second))


def _check_values(later: list | None, a: Array, check: Callable[[], None]) -> None:
    """Runs `check` of a's values now, or appends it to `later` when a lives on a GPU (see run_later)."""
    if later is None or a.device is None:
        check()
    else:
        later.append(check)


def run_later(later: list) -> None:
    """Runs the checks of values in device memory that check_seqlens and check_indices left in
    `later`. Each copies the values to the host, which waits for all the work queued on the GPU
    before it. So an op runs them last, after its other checks and allocations and right before its
    launch: a GPU busy with earlier work then idles only for the launch's own host time once the
    copy returns, not for the whole Python path (chunk_kda's varlen call on the H100 machine: 150-190
    us of idle GPU inside the call when the check came first, 50 now)."""
    for check in later:
        check()


_OFF = ("0", "false", "no", "off")


def checks_off() -> bool:
    """CULA_CHECK_VALUES=0 (or false, no, off) in the environment, read on every call."""
    return os.environ.get("CULA_CHECK_VALUES", "1").strip().lower() in _OFF


def fast_check_indices(check_indices: Any, state_indices: Any) -> Any:
    """A decode's check_indices as its C fast path is to take it, which takes unchecked slots only:
    False where CULA_CHECK_VALUES=0 turns the check off, else check_indices as given (the fast path
    declines True, and the Python path checks the slots or raises for a check_indices that is not a
    bool). The environment is read only where there are slots to check: an os.environ.get of an unset
    variable takes 1.2 us on the build machine's CPU, on every decode call without state_indices."""
    return False if check_indices is True and state_indices is not None and checks_off() else check_indices


def values_unchecked(qa: Array) -> bool:
    """True where the values of cu_seqlens and of pool slots in device memory are not checked on the
    host, the kernels clamping what they read (cu_seqlens to the tokens; a slot out of range is
    padding): while torch captures a CUDA graph on the current stream, where no device-to-host copy
    may run, and with CULA_CHECK_VALUES=0 in the environment (read on every call), for serving loops
    that run these ops outside graphs: each check is a copy that waits for the GPU's queued work."""
    if checks_off():
        return True
    if qa.kind != "torch" or qa.device is None:  # (a CPU tensor fails the device check later)
        return False
    return bool(sys.modules["torch"].cuda.is_current_stream_capturing())


def check_indices(indices: Any, n: int, slots: int, validate_values: bool, name: str = "state_indices",
                  matrix: bool = False, later: list | None = None) -> Array | None:
    """Pool slots per sequence: [N] (or, with matrix, [N, S]: one slot per token), int32/int64, each
    in [-1, slots) (-1 = padding); the values are copied to the host for that check when asked (by
    run_later, given `later`)."""
    if indices is None:
        return None
    ia = view(indices, name)
    if not (ia.shape == (n,) or (matrix and len(ia.shape) == 2 and ia.shape[0] == n and ia.shape[1] >= 1)):
        want = f"[N] = [{n}] or [N, S]" if matrix else f"[N] = [{n}]"
        raise ValueError(f"cula: {name} must have shape {want}, got {_shape(ia)}")
    if ia.dtype not in ("int32", "int64"):
        raise TypeError(f"cula: {name} must be int32 or int64, got {ia.dtype}")
    if validate_values:
        _check_values(later, ia, lambda: _index_values(ia, slots, name))
    return ia


def _index_values(ia: Array, slots: int, name: str) -> None:
    flat = ia.to_host_list()
    rows = flat if len(ia.shape) == 1 else [x for row in flat for x in row]
    bad = [(i, x) for i, x in enumerate(rows) if not -1 <= x < slots]
    if bad:
        i, x = bad[0]
        where = f"[{i}]" if len(ia.shape) == 1 else f"[{i // ia.shape[1]}, {i % ia.shape[1]}]"
        raise ValueError(f"cula: {name} must lie in [-1, {slots}) (-1 = padding), got {name}{where}={x}")


def check_parents(parents: Any, n: int, validate_values: bool, name: str = "retrieve_parent_token",
                  later: list | None = None) -> Array | None:
    """An EAGLE tree's parent tokens [N, S], int32/int64: token t >= 1 of sequence n continues from
    the state after token parents[n, t], which must come before it (< t; negative: the token
    continues from token t-1, as do tokens t >= S). Column 0 (the root's) is not read."""
    if parents is None:
        return None
    pa = view(parents, name)
    if len(pa.shape) != 2 or pa.shape[0] != n or pa.shape[1] < 1:
        raise ValueError(f"cula: {name} must have shape [N, S] = [{n}, S], got {_shape(pa)}")
    if pa.dtype not in ("int32", "int64"):
        raise TypeError(f"cula: {name} must be int32 or int64, got {pa.dtype}")
    if validate_values:
        _check_values(later, pa, lambda: _parent_values(pa, name))
    return pa


def _parent_values(pa: Array, name: str) -> None:
    for i, row in enumerate(pa.to_host_list()):
        for t, x in enumerate(row[1:], 1):
            if x >= t:
                raise ValueError(f"cula: {name}[{i}, {t}] must name an earlier token (< {t}), got {x}")


def check_cache(cache: Any, name: str, v_heads: int, dim: int, steps: Any, layout: str) -> Array:
    """A speculative verify's state cache [C, steps, HV, K, V] float32 (`layout` names the last
    three), written in place: contiguous and 16-byte aligned; `steps`, where given, its second size."""
    ca = view(cache, name)
    if len(ca.shape) != 5 or ca.shape[2:] != (v_heads, dim, dim):
        raise ValueError(f"cula: {name} must have shape {layout} = [C, steps, {v_heads}, {dim}, {dim}], "
                         f"got {_shape(ca)}")
    if ca.dtype != "float32":
        raise TypeError(f"cula: {name} must be float32, got {ca.dtype}")
    if not ca.contiguous or ca.ptr % _ALIGN:
        raise ValueError(f"cula: {name} is written in place, so it must be contiguous and 16-byte aligned")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps != ca.shape[1]):
        raise ValueError(f"cula: cache_steps must be {name}.shape[1] = {ca.shape[1]} (or None), got {steps!r}")
    return ca


def same_device(arrays: dict[str, Array | None]) -> int:
    """All arrays on one CUDA device; returns its ordinal. (One pass: this runs on every call.)"""
    device = None
    for name, a in arrays.items():
        if a is None:
            continue
        if a.device is None:
            raise ValueError(f"cula: {name} must be on a CUDA device, got a {a.device_text} array")
        if device is None:
            device = a.device
        elif a.device != device:
            where = ", ".join(f"{n} on {x.device_text}" for n, x in arrays.items() if x is not None)
            raise ValueError(f"cula: all arrays must be on one CUDA device, got {where}")
    return device


def check_no_grad(arrays: dict[str, Array | None]) -> None:
    """cula's ops are forward-only: refuse tensors that expect a backward pass rather than return
    outputs silently cut off from autograd."""
    for name, a in arrays.items():
        if a is not None and a.kind == "torch" and a.obj.requires_grad:
            import torch
            if torch.is_grad_enabled():
                raise NotImplementedError(
                    f"cula: {name} requires grad, but cula's kernels are forward-only (inference: prefill and "
                    "decode). Call under torch.no_grad() / torch.inference_mode(), or pass detached tensors")


def prepare(a: Array | None) -> Array | None:
    """Contiguous, 16-byte-aligned version of a read-only input (a copy only when needed)."""
    if a is None:
        return None
    if not a.contiguous or a.ptr % _ALIGN:
        return a.contiguous_copy()
    return a


def prepare_rows(a: Array) -> tuple[Array, int]:
    """A token input [..., H, D] (q, k or v) for the token loop, which reads each token's [H, D] row
    at its own stride: (a, the elements from one token's row to the next) where the rows are dense,
    one stride apart throughout (a multiple of 8 elements: 16 bytes) and 16-byte aligned, as views of
    one packed projection are (SGLang's mixed_qkv); else (prepare(a), 0), 0 meaning contiguous."""
    if a.contiguous and a.ptr % _ALIGN == 0:
        return a, 0
    shape, strides = a.shape, a.strides()
    heads, dim = shape[-2], shape[-1]
    lead = [(n, st) for n, st in zip(shape[:-2], strides[:-2], strict=True) if n > 1]
    if strides[-1] != 1 or (heads > 1 and strides[-2] != dim) or not lead or a.ptr % _ALIGN:
        return prepare(a), 0
    stride = lead[-1][1]
    uniform = all(outer[1] == inner[0] * inner[1] for outer, inner in zip(lead[:-1], lead[1:], strict=True))
    if not uniform or stride < heads * dim or stride % 8:
        return prepare(a), 0
    return a, stride
