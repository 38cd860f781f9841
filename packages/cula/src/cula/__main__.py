"""``python -m cula``: what cula found on this machine. ``--selftest`` also runs every kernel
on small inputs against a float64 reference (needs a supported GPU and torch or CuPy)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import sys
import warnings

from . import _loader, _probe
from ._version import __version__


def _line(label: str, text: str) -> str:
    return f"{label:<16}{text}"


def report() -> tuple[str, bool]:
    """The report text, and whether a backend is usable."""
    lines = [_line("cula", f"{__version__} ({_loader.__file__.rsplit('/', 1)[0]})"),
             _line("python", f"{platform.python_version()} ({sys.executable})")]
    for name in _loader.BACKENDS:
        spec = importlib.util.find_spec(f"cula_{name}")
        where = spec.submodule_search_locations[0] if spec and spec.submodule_search_locations else None
        lines.append(_line(f"cula-{name}", f"installed ({where})" if where else "not installed"))
    torch_major = _loader.torch_cuda_major()
    if importlib.util.find_spec("torch") is not None:
        lines.append(_line("torch", f"installed, CUDA {torch_major}" if torch_major else "installed, CPU-only"))
    try:
        probe = _probe.probe()
        lines.append(_line("driver", probe.describe().split("; ")[0] +
                           (f" [{probe.libcuda}]" if probe.libcuda else "")))
        if probe.error:
            lines.append(_line("driver error", probe.error))
        for gpu in probe.gpus:
            target = _probe.SUPPORTED_CC.get(gpu.cc)
            status = f"supported ({target} kernels)" if target else "not supported by cula"
            lines.append(_line(f"GPU {gpu.index}", f"{gpu.name}, compute capability {gpu.cc[0]}.{gpu.cc[1]}, {status}"))
        if probe.driver_found and not probe.error and not probe.gpus:
            lines.append(_line("GPUs", "none visible"))
    except _probe.ProbeError as exc:
        probe = None
        lines.append(_line("driver", f"probe failed: {exc}"))
    ok = True
    try:
        b = _loader.backend()
        lines.append(_line("backend", f"cula-{b.name} {b.module.__version__} ({b.reason}) [{b.path}]"))
        rt = b.module.runtime_version()
        cudart = os.path.realpath(b.module.runtime_library_path())
        lines.append(_line("libcudart", f"{cudart} (CUDA runtime {rt // 1000}.{rt % 1000 // 10}, found via "
                                        f"{b.runtime_found_via})"))
        lines.append(_line("kernels", f"SASS for {', '.join(b.module.ARCHS)}"))
    except _loader.BackendError as exc:
        ok = False
        lines.append(_line("backend", "none usable"))
        lines.append(str(exc))
    rec = _loader.recommended_backend(probe, torch_major)
    if rec is not None:
        lines.append(_line("install", _loader.install_command(rec)))
    return "\n".join(lines), ok


def selftest() -> int:
    """Run every op on small inputs on GPU 0; print one line each; 0 when all pass."""
    import numpy as np

    from . import ops
    from ._reference import rms_ratio, simple_gla_reference

    if importlib.util.find_spec("torch") is not None:
        import torch

        def make(shape, dtype):
            return torch.randn(shape, device="cuda", dtype=getattr(torch, dtype))

        def host(x):
            return x.float().cpu().numpy().astype(np.float64)

        def ints(values):
            return torch.tensor(values, device="cuda", dtype=torch.int32)
    else:
        import cupy

        def make(shape, dtype):
            return cupy.random.standard_normal(shape, dtype="float32").astype(dtype)

        def host(x):
            return cupy.asnumpy(x).astype(np.float64)

        def ints(values):
            return cupy.asarray(values, dtype="int32")

    failures = 0

    def verdict(name, dtype, dim, ref_o, o, ref_h, h):
        nonlocal failures
        e_o, e_h = rms_ratio(ref_o, o), rms_ratio(ref_h, h)
        ok = e_o <= 5e-3 and e_h <= 5e-3
        failures += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {name:<28} {dtype:<9} D={dim:<4} rms(o)={e_o:.1e} rms(state)={e_h:.1e}")

    for dtype in ("bfloat16", "float16"):
        for dim in (64, 128):
            q, k, v = (make((1, 100, 4, dim), dtype) * (dim ** -0.5) for _ in range(3))
            g = abs(make((4,), "float32")) * -0.1 - 0.01
            h0 = make((1, 4, dim, dim), "float32")
            ref_o, ref_h = simple_gla_reference(np, host(q), host(k), host(v), host(g), None, host(h0))
            for name, fn in (("chunk_simple_gla", ops.chunk_simple_gla),
                             ("fused_recurrent_simple_gla", ops.fused_recurrent_simple_gla)):
                o, ht = fn(q, k, v, g_gamma=g, initial_state=h0, output_final_state=True)
                verdict(name, dtype, dim, ref_o, host(o), ref_h, host(ht))
            # Decode one token of a sequence whose state sits in slot 1 of a pool of 2.
            pool = make((2, 4, dim, dim), "float32")
            before = host(pool)
            ref_o, ref_h = simple_gla_reference(np, host(q)[:, :1], host(k)[:, :1], host(v)[:, :1], host(g), None,
                                                before[1:2])
            idx = ints([1])
            o = ops.simple_gla_decode(q[0, :1], k[0, :1], v[0, :1], pool, g_gamma=g, state_indices=idx)
            after = host(pool)
            untouched = bool((after[0] == before[0]).all())
            failures += not untouched
            verdict("simple_gla_decode", dtype, dim, ref_o[0], host(o), ref_h[0], after[1])
            if not untouched:
                print("FAIL  simple_gla_decode changed a state slot it was not given")
            failures += _selftest_gdn(make, host, ints, verdict, dtype, dim)
    print(f"selftest: {'all passed' if not failures else f'{failures} failed'}")
    return 1 if failures else 0


def _selftest_gdn(make, host, ints, verdict, dtype, dim) -> int:
    """The gated delta rule's ops (GVA, l2norm, gate and beta in the kernel) against the float64 token
    loop, which needs torch (on the CPU); returns 1 when the decode wrote a slot it was not given."""
    if importlib.util.find_spec("torch") is None:
        print(f"SKIP  gated_delta_rule ops       {dtype:<9} D={dim:<4} (the reference needs torch)")
        return 0
    import torch

    from . import ops
    from ._reference import gated_delta_rule_reference

    t = lambda x: torch.from_numpy(host(x))  # noqa: E731
    q, k = (make((1, 70, 2, dim), dtype) * (dim ** -0.5) for _ in range(2))
    v = make((1, 70, 4, dim), dtype)
    g, beta = make((1, 70, 4), "float32"), make((1, 70, 4), "float32")
    a_log, dt_bias, h0 = make((4,), "float32"), make((4,), "float32"), make((1, 4, dim, dim), "float32") * 0.1
    opts = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=a_log, dt_bias=dt_bias,
                use_beta_sigmoid_in_kernel=True)
    ref_o, ref_h = gated_delta_rule_reference(t(q), t(k), t(v), t(g), t(beta), None, t(h0), l2norm=True,
                                              A_log=t(a_log), dt_bias=t(dt_bias), beta_sigmoid=True)
    for name, o, ht in (("chunk_gated_delta_rule",
                         *ops.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                                     **opts)),
                        ("fused_recurrent_gated_delta_rule",
                         *ops.fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=h0,
                                                               output_final_state=True, **opts))):
        verdict(name, dtype, dim, ref_o.numpy(), host(o), ref_h.numpy(), host(ht))
    # Decode the first token of the sequence from slot 1 of a pool of 2.
    pool = make((2, 4, dim, dim), "float32") * 0.1
    before = host(pool)
    ref_o, ref_h = gated_delta_rule_reference(t(q)[:, :1], t(k)[:, :1], t(v)[:, :1], t(g)[:, :1], t(beta)[:, :1],
                                              None, torch.from_numpy(before[1:2]), l2norm=True, A_log=t(a_log),
                                              dt_bias=t(dt_bias), beta_sigmoid=True)
    o = ops.gated_delta_rule_decode(q[0, :1], k[0, :1], v[0, :1], g[0, :1], beta[0, :1], pool, state_indices=ints([1]),
                                    **opts)
    after = host(pool)
    verdict("gated_delta_rule_decode", dtype, dim, ref_o[0].numpy(), host(o), ref_h[0].numpy(), after[1])
    if not (after[0] == before[0]).all():
        print("FAIL  gated_delta_rule_decode changed a state slot it was not given")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cula", description=__doc__)
    parser.add_argument("--selftest", action="store_true", help="run every kernel against a reference on GPU 0")
    args = parser.parse_args(argv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", _loader.CulaBackendWarning)
        text, ok = report()
    print(text)
    if args.selftest:
        if not ok:
            print("selftest: skipped, no usable backend")
            return 1
        return selftest()
    return 0


if __name__ == "__main__":
    sys.exit(main())
