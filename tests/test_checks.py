"""Every bad input raises a clear exception naming the argument, what was expected and what was
given, before any launch. Runs without a GPU: CPU tensors pass the dtype/shape checks and stop
at the device check, so each case below isolates one mistake."""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch", reason="the CPU build of torch is installed by tests/run.py on Python 3.11")
cula = pytest.importorskip("cula")

from cula import _checks  # noqa: E402
from cula._arrays import Array  # noqa: E402

B, T, H, D = 2, 10, 3, 64


def qkv(dtype=torch.bfloat16, b=B, t=T, h=H, dk=D, dv=D):
    return (torch.randn(b, t, h, dk, dtype=dtype), torch.randn(b, t, h, dk, dtype=dtype),
            torch.randn(b, t, h, dv, dtype=dtype))


def raises(exc, pattern, fn, *args, **kw):
    with pytest.raises(exc, match=pattern) as info:
        fn(*args, **kw)
    return str(info.value)


SEQ_OPS = [cula.chunk_simple_gla, cula.fused_recurrent_simple_gla]


@pytest.mark.parametrize("op", SEQ_OPS, ids=lambda f: f.__name__)
def test_valid_cpu_inputs_stop_at_the_device_check(op):
    q, k, v = qkv()
    raises(ValueError, r"^cula: q must be on a CUDA device, got a cpu array$", op, q, k, v,
           g_gamma=torch.zeros(H), initial_state=torch.zeros(B, H, D, D), output_final_state=True)


@pytest.mark.parametrize("op", SEQ_OPS, ids=lambda f: f.__name__)
def test_dtypes(op):
    q, k, v = qkv(torch.float32)
    raises(TypeError, r"^cula: q must be bfloat16 or float16, got float32$", op, q, k, v)
    q, k, v = qkv()
    raises(TypeError, r"one dtype, got q bfloat16, k float16, v bfloat16", op, q, k.half(), v)
    raises(TypeError, r"^cula: g_gamma must be float32, got float64$", op, q, k, v, g_gamma=torch.zeros(H).double())
    raises(TypeError, r"^cula: initial_state must be float32, got bfloat16$", op, q, k, v,
           initial_state=torch.zeros(B, H, D, D, dtype=torch.bfloat16))


@pytest.mark.parametrize("op", SEQ_OPS, ids=lambda f: f.__name__)
def test_shapes(op):
    q, k, v = qkv()
    raises(ValueError, r"^cula: q must have shape \[B, T, H, K\] \(4 dims\), got \[10, 3, 64\]$", op, q[0], k, v)
    raises(ValueError, r"^cula: k must have the shape of q \[2, 10, 3, 64\], got \[2, 9, 3, 64\]$",
           op, q, k[:, :9], v)
    raises(ValueError, r"^cula: v must have shape \[2, 10, 3, V\].*got \[2, 10, 2, 64\]$", op, q, k, v[:, :, :2])
    raises(ValueError, r"^cula: g_gamma must have shape \[H\] = \[3\].*got \[2\]$", op, q, k, v,
           g_gamma=torch.zeros(2))
    raises(ValueError, r"^cula: initial_state must have shape \[N, H, K, V\] = \[2, 3, 64, 64\], got \[1, 3, 64, 64\]$",
           op, q, k, v, initial_state=torch.zeros(1, H, D, D))
    raises(ValueError, r"T >= 1\), got T=0$", op, *qkv(t=0))


@pytest.mark.parametrize("op", SEQ_OPS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dk, dv", [(96, 96), (32, 32), (128, 64), (256, 256)])
def test_unsupported_head_dims(op, dk, dv):
    raises(ValueError, rf"K = V in \(64, 128\) are supported, got K={dk} \(q, k\) and V={dv} \(v\)$", op,
           *qkv(dk=dk, dv=dv))


@pytest.mark.parametrize("op", SEQ_OPS, ids=lambda f: f.__name__)
def test_other_arguments(op):
    q, k, v = qkv()
    # a per-token decay g runs (the gated recurrence); its shape and dtype are checked, g_gamma with it refused
    raises(ValueError, r"^cula: q must be on a CUDA device", op, q, k, v, g=torch.zeros(B, T, H))
    raises(ValueError, r"^cula: g must have shape \[B, T, HV\] = \[2, 10, 3\], got \[2, 10\]$", op, q, k, v,
           g=torch.zeros(B, T))
    raises(TypeError, r"^cula: g must be float32, bfloat16 or float16, got int64$", op, q, k, v,
           g=torch.zeros(B, T, H, dtype=torch.int64))
    raises(NotImplementedError, r"g and g_gamma together are not supported", op, q, k, v, g=torch.zeros(B, T, H),
           g_gamma=torch.zeros(H))
    raises(ValueError, r"^cula: scale must be finite, got nan$", op, q, k, v, scale=float("nan"))
    raises(TypeError, r"^cula: scale must be a float or None, got str$", op, q, k, v, scale="0.1")
    raises(TypeError, r"output_final_state must be a bool, got int$", op, q, k, v, output_final_state=1)
    raises(TypeError, r"^cula: q must be a CUDA array .*got builtins.list$", op, [[1.0]], k, v)


@pytest.mark.parametrize("op", SEQ_OPS, ids=lambda f: f.__name__)
def test_cu_seqlens(op):
    q, k, v = qkv(b=1)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    raises(ValueError, r"q must be on a CUDA device", op, q, k, v, cu_seqlens=cu)  # valid up to the device
    raises(ValueError, r"^cula: q must be on a CUDA device", op, q, k, v, cu_seqlens=cu.long(),
           initial_state=torch.zeros(2, H, D, D))
    raises(TypeError, r"^cula: cu_seqlens must be int32 or int64, got float32$", op, q, k, v,
           cu_seqlens=cu.float())
    raises(ValueError, r"^cula: cu_seqlens must have shape \[N\+1\] with N >= 1, got \[1\]$", op, q, k, v,
           cu_seqlens=cu[:1])
    raises(ValueError, r"^cula: cu_seqlens must have shape \[N\+1\] with N >= 1, got \[1, 3\]$", op, q, k, v,
           cu_seqlens=cu[None])
    raises(ValueError, r"^cula: cu_seqlens must start at 0, got 1$", op, q, k, v,
           cu_seqlens=torch.tensor([1, 4, 10]))
    raises(ValueError, r"non-decreasing, got cu_seqlens\[1\]=6 > cu_seqlens\[2\]=4$", op, q, k, v,
           cu_seqlens=torch.tensor([0, 6, 4, 10]))
    raises(ValueError, r"^cula: cu_seqlens\[-1\] must equal the number of tokens T=10, got 9$", op, q, k, v,
           cu_seqlens=torch.tensor([0, 4, 9]))
    raises(ValueError, r"the batch size must be 1 .*got B=2$", op, *qkv(b=2), cu_seqlens=cu)
    raises(ValueError, r"initial_state must have shape \[N, H, K, V\] = \[2, 3, 64, 64\], got \[1, 3, 64, 64\]",
           op, q, k, v, cu_seqlens=cu, initial_state=torch.zeros(1, H, D, D))


@pytest.mark.parametrize("op", SEQ_OPS, ids=lambda f: f.__name__)
def test_tensors_requiring_grad(op):
    q, k, v = qkv()
    q.requires_grad_(True)
    raises(NotImplementedError, r"^cula: q requires grad, but cula's kernels are forward-only", op, q, k, v)
    with torch.no_grad():  # inference: fine up to the device check
        raises(ValueError, r"q must be on a CUDA device", op, q, k, v)


def test_too_many_sequences():
    q, k, v = (torch.empty(65536, 1, 1, 64, dtype=torch.bfloat16) for _ in range(3))
    raises(ValueError, r"at most 65535 sequences per call are supported, got B=65536", cula.chunk_simple_gla, q, k, v)
    raises(ValueError, r"got N=65536", cula.simple_gla_decode, q[:, 0], k[:, 0], v[:, 0],
           torch.empty(65536, 1, 64, 64))


def test_decode_arguments():
    n = 4
    q, k, v = (torch.randn(n, H, D, dtype=torch.float16) for _ in range(3))
    pool = torch.zeros(6, H, D, D)
    idx = torch.tensor([0, 5, -1, 2], dtype=torch.int32)
    raises(ValueError, r"^cula: q must be on a CUDA device", cula.simple_gla_decode, q, k, v, pool, state_indices=idx)
    raises(ValueError, r"must have shape \[N, H, K\] or \[N, 1, H, K\], got \[4, 2, 3, 64\]", cula.simple_gla_decode,
           q[:, None].expand(n, 2, H, D), k, v, pool)
    raises(ValueError, r"^cula: state must have shape \[N, H, K, V\] = \[4, 3, 64, 64\], got \[6, 3, 64, 64\]$",
           cula.simple_gla_decode, q, k, v, pool)
    raises(ValueError, r"state_indices must lie in \[-1, 6\) \(-1 = padding\), got state_indices\[1\]=6$",
           cula.simple_gla_decode, q, k, v, pool, state_indices=torch.tensor([0, 6, -1, 2]))
    raises(ValueError, r"got state_indices\[0\]=-2$", cula.simple_gla_decode, q, k, v, pool,
           state_indices=torch.tensor([-2, 0, 1, 2]))
    raises(TypeError, r"^cula: state_indices must be int32 or int64, got float32$", cula.simple_gla_decode,
           q, k, v, pool, state_indices=idx.float())
    raises(ValueError, r"^cula: state_indices must have shape \[N\] = \[4\], got \[3\]$", cula.simple_gla_decode,
           q, k, v, pool, state_indices=idx[:3])
    msg = raises(ValueError, r"^cula: state is updated in place, so each of its \[3, 64, 64\] states must be "
                 r"contiguous", cula.simple_gla_decode, q, k, v, pool.transpose(2, 3), state_indices=idx)
    assert "16-byte aligned" in msg
    raises(TypeError, r"^cula: state must be float32, got float16$", cula.simple_gla_decode, q, k, v,
           pool.half(), state_indices=idx)
    raises(TypeError, r"state is required", cula.simple_gla_decode, q, k, v, None)
    raises(ValueError, r"^cula: out must have the shape of v \[4, 3, 64\], got \[4, 3, 32\]$", cula.simple_gla_decode,
           q, k, v, pool, state_indices=idx, out=torch.empty(n, H, 32, dtype=torch.float16))
    raises(TypeError, r"^cula: out must have the dtype of v \(float16\), got bfloat16$", cula.simple_gla_decode,
           q, k, v, pool, state_indices=idx, out=torch.empty(n, H, D, dtype=torch.bfloat16))
    raises(ValueError, r"^cula: out is written in place, so it must be contiguous", cula.simple_gla_decode,
           q, k, v, pool, state_indices=idx, out=torch.empty(n, D, H, dtype=torch.float16).transpose(1, 2))
    raises(TypeError, r"^cula: out must be a CUDA array", cula.simple_gla_decode, q, k, v, pool, state_indices=idx,
           out=[0.0])
    raises(ValueError, r"^cula: q must be on a CUDA device", cula.simple_gla_decode, q, k, v, pool,
           state_indices=idx, out=torch.empty_like(v))


def test_lightning_arguments():
    q, k, v = qkv()
    raises(ValueError, r"need 0 <= layer_idx < num_layers, got layer_idx=4, num_layers=4", cula.chunk_lightning_attn,
           q, k, v, layer_idx=4, num_layers=4)
    raises(TypeError, r"^cula: layer_idx must be an int, got float$", cula.fused_recurrent_lightning_attn,
           q, k, v, layer_idx=1.0, num_layers=4)
    raises(TypeError, r"^cula: num_layers must be an int, got bool$", cula.lightning_attn_decode,
           q[:, 0], k[:, 0], v[:, 0], torch.zeros(B, H, D, D), layer_idx=0, num_layers=True)
    raises(TypeError, r"^cula: layer_idx must be an int, got list$", cula.chunk_lightning_attn, q, k, v, [1], 4)
    raises(ValueError, r"^cula: q must be on a CUDA device", cula.chunk_lightning_attn, q, k, v, 1, 4)
    g = cula.lightning_attn_g_gamma(4, 3, 12)
    assert g == pytest.approx([-(8 / 4) * (1 - 3 / 12) * h for h in range(4)]) and g[0] == 0


def _array(name_device):
    device = None if name_device == "cpu" else int(name_device.split(":")[1])
    return Array(None, "torch", (1,), "float32", device, name_device, True, lambda: 0)


def test_arrays_on_different_gpus():
    """Two CUDA devices cannot be made on this machine: the check itself is exercised on views."""
    msg = raises(ValueError, r"all arrays must be on one CUDA device", _checks.same_device,
                 {"q": _array("cuda:0"), "k": _array("cuda:1"), "v": _array("cuda:0"), "g_gamma": None})
    assert msg.endswith("got q on cuda:0, k on cuda:1, v on cuda:0")
    assert _checks.same_device({"q": _array("cuda:1"), "k": _array("cuda:1")}) == 1


def test_errors_come_before_any_launch():
    """The argument checks never touch the backend's launch functions (a CPU pointer reaching a
    kernel would crash the process): they fail the same with the launch functions removed."""
    from cula import _loader
    module = _loader.backend().module
    saved = module.chunk_simple_gla
    try:
        del module.chunk_simple_gla
        q, k, v = qkv()
        raises(ValueError, r"q must be on a CUDA device", cula.chunk_simple_gla, q, k, v)
    finally:
        module.chunk_simple_gla = saved
    assert re.match(r"\d+\.\d+\.\d+", cula.__version__)


def test_fla_signature_options():
    """Everything FLA 0.6.0 accepts is accepted (or refused clearly), nothing is silently ignored."""
    q, k, v = qkv(b=1)
    cu = torch.tensor([0, 4, 10])
    # valid FLA calls run up to the device check
    raises(ValueError, r"q must be on a CUDA device", cula.chunk_simple_gla, q, k, v, chunk_size=64,
           state_v_first=False, cu_seqlens=cu, cu_seqlens_cpu=cu.clone())
    raises(ValueError, r"q must be on a CUDA device", cula.fused_recurrent_simple_gla, q, k, v, state_v_first=False)
    raises(ValueError, r"q must be on a CUDA device", cula.chunk_lightning_attn, q, k, v, 0, 2, chunk_size=32)
    raises(NotImplementedError, r"state_v_first=True .* is not supported yet", cula.chunk_simple_gla, q, k, v,
           state_v_first=True)
    raises(DeprecationWarning, r"head_first has been removed", cula.chunk_simple_gla, q, k, v, head_first=False)
    raises(ValueError, r"chunk_size must be a power of 2, got 48", cula.chunk_simple_gla, q, k, v, chunk_size=48)
    raises(TypeError, r"unexpected keyword argument\(s\): bogus$", cula.fused_recurrent_simple_gla, q, k, v,
           bogus=1)
    raises(ValueError, r"chunk_lightning_attn: chunk_size must be a power of 2, got 0", cula.chunk_lightning_attn,
           q, k, v, 0, 2, chunk_size=0)
    raises(TypeError, r"unexpected keyword argument\(s\): bogus$", cula.chunk_lightning_attn, q, k, v, 0, 2, bogus=1)
    # cu_seqlens_cpu is what gets validated (no device copy), and must match cu_seqlens' shape
    raises(ValueError, r"cu_seqlens\[-1\] must equal the number of tokens T=10, got 9", cula.chunk_simple_gla,
           q, k, v, cu_seqlens=cu, cu_seqlens_cpu=torch.tensor([0, 4, 9]))
    raises(ValueError, r"cu_seqlens_cpu must have the shape of cu_seqlens \[3\], got \[2\]", cula.chunk_simple_gla,
           q, k, v, cu_seqlens=cu, cu_seqlens_cpu=cu[:2])
    raises(ValueError, r"cu_seqlens_cpu is given without cu_seqlens", cula.chunk_simple_gla, q, k, v,
           cu_seqlens_cpu=cu)


def test_seqlens_check_gives_the_longest_sequence():
    """check_seqlens hands the longest sequence to the chunk ops' choice of kernels (the token loop
    for short ones; the split of one long sequence among short ones) once it has read the values:
    its tokens, its index (the first of that length), its first row and the longest of the others'
    tokens; from a host array at once, nothing left for later, and not when a value is wrong."""
    for values, most in (([0, 3, 3, 10, 12], [7, 2, 3, 3]), ([0, 0, 5], [5, 1, 0, 0]), ([0, 1], [1, 0, 0, 0]),
                         ([0, 4, 6, 10, 20, 21], [10, 3, 10, 4]), ([0, 5, 10, 12], [5, 0, 0, 5])):
        later, longest = [], []
        cu = torch.tensor(values, dtype=torch.int32)
        assert _checks.check_seqlens(cu, 1, values[-1], cu.clone(), later, longest)[1:] == \
            (len(values) - 1, len(values) == 2)
        assert (later, longest) == ([], most), values
    longest = []
    raises(ValueError, r"non-decreasing", _checks.check_seqlens, torch.tensor([0, 6, 4, 10]), 1, 10, None, [],
           longest)
    assert longest == []


def test_one_checked_sequence_runs_as_fixed_length():
    """One sequence whose cu_seqlens are checked ([0, T] or an error before the launch) reaches the
    kernels as the fixed-length call of B = 1; unchecked, or with more sequences, cu_seqlens itself."""
    cu = torch.tensor([0, 7], dtype=torch.int64)
    ca, n, one = _checks.check_seqlens(cu, 1, 7, cu.clone(), [], [])
    assert one and _checks.seq_args(ca, n, 7, one) == (0, False, 1, 7)
    ca, n, one = _checks.check_seqlens(cu, 1, 7, None, [], [], check_values=False)
    assert not one and _checks.seq_args(ca, n, 7, one) == (ca.ptr, True, 1, 0)
    two = torch.tensor([0, 7, 7], dtype=torch.int32)  # (one sequence holds every token, another is empty)
    ca, n, one = _checks.check_seqlens(two, 1, 7, two.clone(), [], [])
    assert not one and _checks.seq_args(ca, n, 7, one) == (ca.ptr, False, 2, 0)
    assert _checks.seq_args(None, 3, 7, False) == (0, False, 3, 7)
    raises(ValueError, r"cu_seqlens\[-1\] must equal the number of tokens T=8, got 7", _checks.check_seqlens,
           cu, 1, 8, cu.clone(), [], [])


def test_token_rows_read_in_place():
    """The token loop reads q, k and v at their row stride: views of one packed projection (SGLang's
    mixed_qkv) go as they are; rows that are not dense [H, D] pieces one stride apart throughout (a
    multiple of 8 elements) are copied (stride 0: contiguous)."""
    def rows(x):
        a = _checks.view(x, "q")
        got, stride = _checks.prepare_rows(a)
        return got.obj is x, stride

    packed = torch.zeros(5, 2 * 2 * D + 4 * D, dtype=torch.bfloat16)  # [B, 2 H K + HV V], H = 2, HV = 4
    width = packed.shape[1]
    assert rows(packed[:, :2 * D].reshape(5, 1, 2, D)) == (True, width)
    assert rows(packed[:, 2 * D:4 * D].reshape(5, 2, D)) == (True, width)
    assert rows(packed[:, 4 * D:].reshape(1, 5, 4, D)) == (True, width)
    q = torch.zeros(B, 6, H, D, dtype=torch.bfloat16)
    assert rows(q) == (True, 0)
    assert rows(q[:, ::2]) == (True, 2 * H * D)  # (the batch's rows one stride apart too)
    assert rows(q[:, :3]) == (False, 0)  # (a gap between the sequences)
    assert rows(q.transpose(2, 3)[..., :H]) == (False, 0)  # (rows not dense)
    assert rows(torch.zeros(5, 2 * D + 4, dtype=torch.bfloat16)[:, :2 * D].reshape(5, 2, D)) == (False, 0)
    overlapping = torch.zeros(8 * D, dtype=torch.bfloat16).as_strided((5, 2, D), (D, D, 1))
    assert rows(overlapping) == (False, 0)
