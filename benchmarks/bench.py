"""cula against FLA's Triton kernels, on the same inputs, in one process, timed one way.

    python benchmarks/bench.py [--variants sm90a generic] [--out-dir benchmarks/results] [--name h200-cu13]
                               [--cases REGEX] [--parts configs host sweep]

What it prints (and writes as <name>.md, with a plot <name>.png of time against T):

- prefill / varlen / decode: GPU time of one call, CUDA events around the call with the L2 cache
  flushed before it (as triton's do_bench does) and the GPU then kept busy for ~0.5 ms, so that the
  host's launch overhead (about 20 us for cula, 100-150 us for FLA) never shows up as GPU time; 5
  warm-up calls, median of 30. FLA is timed by the same function on the same tensors.
- TB/s: the op's fused floor (bytes it must move at least: q, k, v read and o written once, states
  read and written once) over its time; decode rows also give it as a share of the device's copy
  bandwidth, measured in the same run (torch's device-to-device copy of 1 GiB).
- host: the time to enqueue one call through the Python API while the GPU is kept busy (no GPU
  time counted), with torch.add as a reference; wall: time per call of 1000 back-to-back calls, one
  synchronize at the end (what a serving loop sees: host overhead and GPU time, whichever is longer).

cula's variants: sm90a (Hopper: TMA, wgmma) and generic (what the sm_100 family runs), forced with
CULA_FORCE_GENERIC; inverse is sm90a with the gated delta rule's prep kernel forming W and U0
through the inverse of I + A (CULA_GDN_PREP=inverse: the two-launch prefill's only difference).
Each variant after the first gets its own columns. The outputs of cula and FLA are compared on
every config (max abs difference).

A run can be split (FLA compiles its Triton kernels on first use, so one full run takes longer than
some machines allow a command): ``--cases REGEX`` times only the configs whose name matches,
``--parts`` only some of the three tables. Every run keeps its rows in <name>.json next to the .md;
a partial run updates those rows and writes the .md of all rows measured so far (each row's cula
and FLA times still come from one process), a full run starts them afresh.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

import cula
import torch

FLUSH_BYTES = 256 << 20  # larger than the H100/H200/B200 L2
PARTS = ("configs", "host", "sweep")  # the three tables (--parts)


class Timer:
    def __init__(self) -> None:
        self.flush_buf = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")

    def gpu_ms(self, fn, reps: int = 30, warmup: int = 5) -> float:
        for _ in range(warmup):
            fn()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for a, b in zip(starts, ends, strict=True):
            self.flush_buf.zero_()
            if hasattr(torch.cuda, "_sleep"):
                torch.cuda._sleep(1_000_000)  # ~0.5 ms of GPU time while the host enqueues the call
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize()
        return statistics.median(a.elapsed_time(b) for a, b in zip(starts, ends, strict=True))

    @staticmethod
    def wall_us(fn, calls: int = 1000, warmup: int = 50) -> float:
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - t0) / calls * 1e6)
        return best

    @staticmethod
    def host_us(fn, calls: int = 200, warmup: int = 20) -> float:
        """Time to enqueue one call: the calls are timed behind a long GPU sleep, so that no GPU
        time (nor waiting for a full launch queue) is counted."""
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(5):
            torch.cuda._sleep(100_000_000)
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            best = min(best, (time.perf_counter() - t0) / calls * 1e6)
            torch.cuda.synchronize()
        return best

    def copy_tbps(self) -> float:
        src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        ms = self.gpu_ms(lambda: dst.copy_(src), reps=10)
        return 2 * src.numel() / ms / 1e9


def load_fla():
    try:
        from fla.ops.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla
    except Exception as exc:  # noqa: BLE001 - any failure to import means "not available"
        print(f"bench: FLA not available ({type(exc).__name__}: {exc}); timing cula alone", file=sys.stderr)
        return None
    import fla
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    from fla.ops.kda import chunk_kda, fused_recurrent_kda
    return {"chunk": chunk_simple_gla, "recurrent": fused_recurrent_simple_gla, "gdn_chunk": chunk_gated_delta_rule,
            "gdn_recurrent": fused_recurrent_gated_delta_rule, "kda_chunk": chunk_kda,
            "kda_recurrent": fused_recurrent_kda, "version": getattr(fla, "__version__", "?")}


def set_variant(variant: str) -> None:
    os.environ["CULA_FORCE_GENERIC"] = "1" if variant == "generic" else "0"
    os.environ["CULA_GDN_PREP"] = "inverse" if variant == "inverse" else "solve"


class Prefill:
    """chunk_simple_gla on B sequences of T tokens (or packed varlen sequences)."""

    op = "chunk"

    def __init__(self, batch, tokens, heads, dim=128, dtype=torch.bfloat16, state=False, lengths=None, name=None):
        self.name = name or (f"prefill B={batch} T={tokens} H={heads}" + (" +state" if state else "")
                             + ("" if dim == 128 else f" D={dim}") + ("" if dtype == torch.bfloat16 else " fp16"))
        gen = torch.Generator(device="cuda").manual_seed(0)
        shape = (batch, tokens, heads, dim)
        self.q, self.k, self.v = (torch.randn(shape, device="cuda", dtype=dtype, generator=gen) * 0.3
                                  for _ in range(3))
        self.k = self.k * dim ** -0.5
        nseq = batch if lengths is None else len(lengths)
        self.kw = dict(g_gamma=-torch.rand(heads, device="cuda", generator=gen) * 0.2 - 0.01,
                       initial_state=torch.randn(nseq, heads, dim, dim, device="cuda", generator=gen) * 0.1
                       if state else None,
                       output_final_state=state,
                       cu_seqlens=None if lengths is None else
                       torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda"))
        elem = self.q.element_size()
        self.floor = 4 * batch * tokens * heads * dim * elem + (2 * nseq * heads * dim * dim * 4 if state else 0)
        self.tokens = tokens

    def cula(self):
        return cula.chunk_simple_gla(self.q, self.k, self.v, **self.kw)

    def fla(self, fla):
        return fla["chunk"](self.q, self.k, self.v, **self.kw)


class Recurrent(Prefill):
    """fused_recurrent_simple_gla (token by token)."""

    op = "recurrent"

    def __init__(self, batch, tokens, heads, **kw):
        super().__init__(batch, tokens, heads, name=f"recurrent B={batch} T={tokens} H={heads}", **kw)

    def cula(self):
        return cula.fused_recurrent_simple_gla(self.q, self.k, self.v, **self.kw)

    def fla(self, fla):
        return fla["recurrent"](self.q, self.k, self.v, **self.kw)


class Decode:
    """One decode step for B sequences, fp32 state pool updated in place (FLA: fused_recurrent with
    T=1, initial_state in, final_state out: the same bytes)."""

    op = "decode"

    def __init__(self, batch, heads=32, dim=128):
        self.name = f"decode B={batch} H={heads}" + ("" if dim == 128 else f" D={dim}")
        gen = torch.Generator(device="cuda").manual_seed(1)
        self.q, self.k, self.v = (torch.randn(batch, heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
                                  for _ in range(3))
        self.pool = torch.randn(batch, heads, dim, dim, device="cuda", generator=gen) * 0.1
        self.g = -torch.rand(heads, device="cuda", generator=gen) * 0.2 - 0.01
        self.floor = 2 * batch * heads * dim * dim * 4 + 4 * batch * heads * dim * 2
        self.tokens = batch

    def cula(self):
        return cula.simple_gla_decode(self.q, self.k, self.v, self.pool, g_gamma=self.g)

    def fla(self, fla):
        o, ht = fla["recurrent"](self.q[:, None], self.k[:, None], self.v[:, None], g_gamma=self.g,
                                 initial_state=self.pool, output_final_state=True)
        return o[:, 0]


class GdnPrefill:
    """chunk_gated_delta_rule (Qwen3-Next's linear layers: H=16 q/k heads, HV=32 value heads), l2norm
    in the kernel, with states; FLA's chunk_gated_delta_rule on the same inputs."""

    op = "gdn"

    def __init__(self, batch, tokens, heads, v_heads, dim=128, lengths=None, name=None):
        self.name = name or (f"GDN prefill B={batch} T={tokens} H={heads} HV={v_heads}"
                             + (f" D={dim}" if dim != 128 else "") + " +state")
        gen = torch.Generator(device="cuda").manual_seed(2)
        self.q, self.k = (torch.randn(batch, tokens, heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
                          for _ in range(2))
        self.v = torch.randn(batch, tokens, v_heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
        self.g = -torch.rand(batch, tokens, v_heads, device="cuda", generator=gen) * 0.1
        self.beta = torch.rand(batch, tokens, v_heads, device="cuda", generator=gen)
        nseq = batch if lengths is None else len(lengths)
        self.kw = dict(initial_state=torch.randn(nseq, v_heads, dim, dim, device="cuda", generator=gen) * 0.1,
                       output_final_state=True, use_qk_l2norm_in_kernel=True,
                       cu_seqlens=None if lengths is None else
                       torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda"))
        rows = batch * tokens
        self.floor = (2 * rows * heads * dim + 2 * rows * v_heads * dim) * 2 + rows * v_heads * 8 + \
            2 * nseq * v_heads * dim * dim * 4
        self.tokens = tokens

    def cula(self):
        return cula.chunk_gated_delta_rule(self.q, self.k, self.v, self.g, self.beta, **self.kw)

    def fla(self, fla):
        return fla["gdn_chunk"](self.q, self.k, self.v, self.g, self.beta, **self.kw)


class GdnPoolPrefill(GdnPrefill):
    """SGLang's extend call: chunk_gated_delta_rule on a value-first pool of 4 N slots, read at N slots
    and written back in place (initial_state_indices); FLA 0.6.0, which takes no pool, on the slots'
    states gathered before the call and scattered back after it, as an engine on FLA's signature does."""

    def __init__(self, lengths, heads, v_heads, name):
        super().__init__(1, sum(lengths), heads, v_heads, lengths=lengths, name=name)
        n = len(lengths)
        gen = torch.Generator(device="cuda").manual_seed(6)
        self.pool = torch.randn(4 * n, v_heads, 128, 128, device="cuda", generator=gen) * 0.1
        self.slots = torch.randperm(4 * n, device="cuda", generator=gen)[:n]
        del self.kw["initial_state"], self.kw["output_final_state"]

    def cula(self):
        return cula.chunk_gated_delta_rule(self.q, self.k, self.v, self.g, self.beta, initial_state=self.pool,
                                           initial_state_indices=self.slots, state_v_first=True, **self.kw)

    def fla(self, fla):
        o, ht = fla["gdn_chunk"](self.q, self.k, self.v, self.g, self.beta, initial_state=self.pool[self.slots],
                                 output_final_state=True, state_v_first=True, **self.kw)
        self.pool[self.slots] = ht
        return o, self.pool


class GdnDecode:
    """gated_delta_rule_decode: one token per sequence, the fp32 state pool updated in place (FLA:
    fused_recurrent_gated_delta_rule with T=1, initial_state in, final_state out: the same bytes).
    v_first: the pool value-first, [P, HV, V, K] (state_v_first; SGLang's layout), in both."""

    op = "decode"

    def __init__(self, batch, heads=16, v_heads=32, dim=128, v_first=False):
        self.name = f"GDN decode N={batch} H={heads} HV={v_heads}" + ("" if dim == 128 else f" D={dim}")
        gen = torch.Generator(device="cuda").manual_seed(3)
        self.q, self.k = (torch.randn(batch, heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
                          for _ in range(2))
        self.v = torch.randn(batch, v_heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
        self.g = -torch.rand(batch, v_heads, device="cuda", generator=gen) * 0.1
        self.beta = torch.rand(batch, v_heads, device="cuda", generator=gen)
        self.pool = torch.randn(batch, v_heads, dim, dim, device="cuda", generator=gen) * 0.1
        self.floor = 2 * batch * v_heads * dim * dim * 4
        self.tokens = batch
        self.layout = {"state_v_first": True} if v_first else {}  # (absent when False: older wheels lack it)
        if v_first:
            self.name += " state_v_first"

    def cula(self):
        return cula.gated_delta_rule_decode(self.q, self.k, self.v, self.g, self.beta, self.pool,
                                            use_qk_l2norm_in_kernel=True, **self.layout)

    def fla(self, fla):
        o, _ = fla["gdn_recurrent"](self.q[:, None], self.k[:, None], self.v[:, None], g=self.g[:, None],
                                    beta=self.beta[:, None], initial_state=self.pool, output_final_state=True,
                                    use_qk_l2norm_in_kernel=True, **self.layout)
        return o[:, 0]


def _kda_gate(case, gen, shape, v_heads, dim) -> None:
    """KDA's per-key gate as Kimi Linear runs it: the raw input, the in-kernel safe gate with a
    lower bound (FLA's safe_gate path), beta as logits."""
    case.g = torch.randn(*shape, v_heads, dim, device="cuda", generator=gen)
    case.kw.update(use_gate_in_kernel=True, A_log=torch.rand(v_heads, device="cuda", generator=gen) - 2,
                   dt_bias=torch.randn(v_heads * dim, device="cuda", generator=gen) * 0.5, lower_bound=-5.0,
                   use_beta_sigmoid_in_kernel=True)
    case.floor += case.g.numel() * 4


class KdaPrefill(GdnPrefill):
    """chunk_kda (Kimi Linear: H = HV heads), the safe gate computed in the kernel, l2norm in the
    kernel, with states; FLA's chunk_kda on the same inputs."""

    def __init__(self, batch, tokens, heads, lengths=None, name=None):
        super().__init__(batch, tokens, heads, heads, lengths=lengths,
                         name=name or f"KDA prefill B={batch} T={tokens} H={heads} +state")
        _kda_gate(self, torch.Generator(device="cuda").manual_seed(4), (batch, tokens), heads, 128)
        self.kw["safe_gate"] = True

    def cula(self):
        return cula.chunk_kda(self.q, self.k, self.v, self.g, self.beta, **self.kw)

    def fla(self, fla):
        return fla["kda_chunk"](self.q, self.k, self.v, self.g, self.beta, **self.kw)


class KdaDecode(GdnDecode):
    """kda_decode: one token per sequence, the fp32 state pool updated in place (FLA:
    fused_recurrent_kda with T=1, initial_state in, final_state out)."""

    def __init__(self, batch, heads=32, dim=128, v_first=False):
        super().__init__(batch, heads, heads, dim, v_first=v_first)
        self.name = (f"KDA decode N={batch} H={heads}" + ("" if dim == 128 else f" D={dim}")
                     + (" state_v_first" if v_first else ""))
        self.kw = dict(self.layout)
        _kda_gate(self, torch.Generator(device="cuda").manual_seed(5), (batch,), heads, dim)

    def cula(self):
        return cula.kda_decode(self.q, self.k, self.v, self.g, self.beta, self.pool, use_qk_l2norm_in_kernel=True,
                               **self.kw)

    def fla(self, fla):
        o, _ = fla["kda_recurrent"](self.q[:, None], self.k[:, None], self.v[:, None], self.g[:, None],
                                    self.beta[:, None], initial_state=self.pool, output_final_state=True,
                                    use_qk_l2norm_in_kernel=True, **self.kw)
        return o[:, 0]


class GatePrefill(Prefill):
    """chunk_simple_gla with a per-token gate g [B, T, H] (against cula's own g_gamma prefill too)."""

    def __init__(self, batch, tokens, heads, dim=128):
        super().__init__(batch, tokens, heads, dim=dim, name=f"simple_gla per-token g B={batch} T={tokens} H={heads}"
                         + ("" if dim == 128 else f" D={dim}"))
        gamma = self.kw.pop("g_gamma")
        self.kw["g"] = gamma.expand(batch, tokens, heads).contiguous()


def _random_lengths(n, total, seed=0) -> list[int]:
    """n sequence lengths summing to total (a fixed seed: the same lengths every run)."""
    gen = torch.Generator().manual_seed(seed)
    cuts = sorted(torch.randperm(total - 1, generator=gen)[:n - 1].add(1).tolist())
    return [b - a for a, b in zip([0, *cuts], [*cuts, total], strict=True)]


def call_once(case, fn):
    """fn() on the case's inputs as they are (a case with a pool: the pool restored afterwards)."""
    saved = case.pool.clone() if hasattr(case, "pool") else None
    out = fn()
    if saved is not None:
        case.pool.copy_(saved)
    return out


def checksum(case) -> list[float]:
    """The float64 sums of what one call of cula returns (o, and the final state where there is
    one): two builds that compute the same give the same sums (tests/run.py --compare)."""
    out = call_once(case, case.cula)
    return [x.double().sum().item() for x in (out if isinstance(out, tuple) else (out,)) if x is not None]


def max_diff(case, fla) -> float:
    """cula against FLA on the same inputs (from the same starting pool, where there is one): the largest
    difference of o relative to the largest |o| of FLA."""
    ref, mine = call_once(case, lambda: case.fla(fla)), call_once(case, case.cula)
    if not isinstance(case, (Decode, GdnDecode)):
        ref, mine = ref[0], mine[0]
    return ((ref.float() - mine.float()).abs().max() / ref.float().abs().max()).item()


def table(head: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(r) + " |" for r in rows])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", default=["sm90a", "generic"], choices=["sm90a", "generic", "inverse"])
    parser.add_argument("--out-dir", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--name", help="file name stem (default: <gpu>-<backend>, e.g. h200-cu13)")
    parser.add_argument("--no-sweep", action="store_true", help="skip the time-vs-T sweep and its plot")
    parser.add_argument("--cases", metavar="REGEX", type=re.compile,
                        help="only the configs whose name matches (case-sensitive re.search); keeps the other rows")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                        help="which tables to measure (default all); the others are kept from <name>.json")
    parser.add_argument("--no-fla", action="store_true", help="time cula alone (tests/run.py --compare)")
    opts = parser.parse_args()
    parts = [p for p in opts.parts if not (p == "sweep" and opts.no_sweep)]
    partial = opts.cases is not None or set(parts) != set(PARTS)

    torch.backends.cuda.matmul.allow_tf32 = False
    gpu = torch.cuda.get_device_name()
    slug = re.sub(r"[^a-z0-9]+", "", gpu.lower().replace("nvidia", "").split()[0]) or "gpu"
    from cula._loader import backend as loaded_backend
    backend = loaded_backend().name
    name = opts.name or f"{slug}-{backend}"
    fla = None if opts.no_fla else load_fla()
    timer = Timer()
    copy = timer.copy_tbps()
    variants = opts.variants if torch.cuda.get_device_capability() == (9, 0) else \
        list(dict.fromkeys("generic" if v == "sm90a" else v for v in opts.variants))
    main_variant = variants[0]

    cases = [
        Prefill(2, 8192, 32), Prefill(2, 8192, 64), Prefill(8, 1024, 32, state=True),
        Prefill(1, 16384, 64, state=True, lengths=[1024] * 16, name="varlen 16x1024 H=64 +state"),
        Prefill(2, 8192, 32, dim=64), Prefill(2, 8192, 32, dtype=torch.float16),
        Prefill(1, 2048, 8, name="prefill B=1 T=2048 H=8 (B*H < SMs)"),
        Decode(1), Decode(16), Decode(256), Recurrent(2, 1024, 32),
        GdnPrefill(2, 8192, 16, 32), GdnPrefill(2, 8192, 32, 32),
        GdnPrefill(1, 16384, 16, 32, lengths=[1024] * 16, name="GDN varlen 16x1024 H=16 HV=32 +state"),
        GdnPrefill(1, 8192, 16, 32, lengths=_random_lengths(64, 8192, 2),
                   name="GDN varlen 64 random lengths, 8192 H=16 HV=32 +state"),
        GdnPrefill(1, 16384, 16, 32, lengths=[64] * 256,
                   name="GDN varlen 256x64 H=16 HV=32 +state"),
        GdnPrefill(1, 32768, 16, 32), GdnPrefill(1, 32768, 4, 8, name="GDN prefill B=1 T=32768 H=4 HV=8 (TP=4)"),
        GdnPrefill(1, 32768, 4, 8, lengths=[32768],
                   name="GDN varlen one prompt T=32768 H=4 HV=8 (TP=4, as engines pass it)"),
        GdnPrefill(1, 17920, 4, 8, lengths=[16384, 512, 512, 512],
                   name="GDN varlen one long prompt beside short ones, 16384 + 3x512 H=4 HV=8 (TP=4)"),
        GdnPrefill(1, 1024, 16, 32), GdnPrefill(2, 8192, 16, 32, dim=64), GdnDecode(256), GatePrefill(2, 8192, 32),
        GatePrefill(2, 8192, 32, dim=64),
        KdaPrefill(2, 8192, 64), KdaPrefill(1, 16384, 64), KdaPrefill(1, 8192, 64, lengths=_random_lengths(20, 8192),
                                                                      name="KDA varlen 20 random lengths, 8192 H=64"),
        KdaPrefill(1, 1024, 64), KdaDecode(256), GdnDecode(256, v_first=True), KdaDecode(256, v_first=True),
        GdnDecode(256, dim=64), KdaDecode(256, dim=64),
        GdnPoolPrefill([1024] * 16, 16, 32, name="GDN varlen 16x1024 H=16 HV=32 SGLang pool (V-first, in place)"),
    ]
    order = [case.name for case in cases]  # the configs in this file's order; rows of dropped configs go
    if len(set(order)) != len(order):
        raise SystemExit("bench: two configs share a name")
    out = Path(opts.out_dir)
    fla_text = f"FLA {fla['version']} (Triton)" if fla else "FLA not installed"
    saved = load_saved(out / f"{name}.json", gpu, backend, fla_text, variants) if partial else {}
    res = {"gpu": gpu, "backend": backend, "fla": fla_text, "cula": cula.__version__, "variants": variants,
           "copy": saved.get("copy", copy), "configs": saved.get("configs", {}), "host": saved.get("host", {}),
           "sweep": saved.get("sweep", {})}

    def save(final: bool = False) -> None:
        """Writes <name>.md and .json of the rows so far (after every row: a run cut short keeps them)."""
        configs = [res["configs"][n] for n in order if n in res["configs"]]
        head = ["config", f"cula {main_variant} ms", "FLA ms", "ratio (FLA / cula)",
                "cula TB/s (floor / time)", "FLA TB/s"]
        for other in variants[1:]:
            head += [f"cula {other} ms", f"{other} / {main_variant}"]
        head.append("max |cula - FLA| / max |FLA|")
        runs = "several runs (`--cases` / `--parts`), each row's cula and FLA times from one process" if partial \
            else "one run"
        text = "\n\n".join([
            f"# {gpu}, cula {res['cula']} ({backend}), {fla_text}",
            f"bf16, K = V = 128 unless said; GPU time per call (CUDA events, L2 flushed and the GPU kept busy ~0.5 ms "
            f"before each call so that no host overhead is counted, median of 30). "
            f"Copy bandwidth measured in the last run: {res['copy']:.2f} TB/s. Command: `python benchmarks/bench.py` "
            f"(`make bench`); rows from {runs}.",
            table(["config", "cula ms", "FLA ms", "ratio"], [c["main"] for c in configs]),
            "## Details", table(head, [c["row"] for c in configs]),
            "## Host time and wall time per call through the Python API",
            "host: the time to enqueue one call while the GPU is kept busy (no GPU time counted; best of 5 x 200 "
            "calls); wall: 1000 back-to-back calls, one synchronize (host or GPU time, whichever is longer).",
            table(["case", "cula host µs", "cula wall µs", "FLA wall µs"], list(res["host"].values())),
        ]) + "\n"
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{name}.md").write_text(text)
        (out / f"{name}.json").write_text(json.dumps(res, indent=1) + "\n")
        if final and res["sweep"] and "sweep" in parts:
            plot(res["sweep"], out / f"{name}.png", f"{gpu}, cula {backend} {main_variant} vs {fla_text}")
        if final:
            print("\n" + text)

    with torch.inference_mode():
        for case in cases if "configs" in parts else []:
            if opts.cases is not None and not opts.cases.search(case.name):
                continue
            res["copy"] = copy
            times = {}
            for variant in variants:
                set_variant(variant)
                times[variant] = timer.gpu_ms(case.cula)
            set_variant(main_variant)
            fla_ms = timer.gpu_ms(lambda: case.fla(fla)) if fla else None
            diff = max_diff(case, fla) if fla else None
            ms = times[main_variant]
            tbps = case.floor / ms / 1e9
            share = f" ({tbps / copy:.0%} of copy)" if isinstance(case, (Decode, GdnDecode)) else ""
            ratio = f"{fla_ms / ms:.2f}x" if fla_ms else "-"
            fla_ms_text = f"{fla_ms:.4f}" if fla_ms else "-"
            row = [case.name, f"{ms:.4f}", fla_ms_text, ratio, f"{tbps:.2f}{share}",
                   f"{case.floor / fla_ms / 1e9:.2f}" if fla_ms else "-"]
            for other in variants[1:]:
                row += [f"{times[other]:.4f}", f"{times[other] / ms:.2f}"]
            row.append(f"{diff:.1e}" if diff is not None else "-")
            res["configs"][case.name] = {"main": [case.name, f"{ms:.4f}", fla_ms_text, ratio], "row": row,
                                         "ms": times, "sums": checksum(case)}
            print(" | ".join(row), flush=True)
            save()

        set_variant(main_variant)
        if "host" in parts:  # host time and wall time per call of every op (small inputs: a serving loop's host)
            res["host"] = {}  # (every case: rows of cases no longer measured go)
            for case, fn, ref in host_calls(fla):
                res["host"][case] = [case, f"{timer.host_us(fn):.1f}", f"{timer.wall_us(fn):.1f}",
                                     f"{timer.wall_us(ref):.1f}" if fla and ref else "-"]
                print(" | ".join(res["host"][case]), flush=True)
                save()

        if "sweep" in parts:
            res["sweep"] = {}
            for op, make, tokens in (("chunk_simple_gla B=2 H=32", lambda t: Prefill(2, t, 32),
                                      [512, 1024, 2048, 4096, 8192, 16384]),
                                     ("fused_recurrent_simple_gla B=2 H=32", lambda t: Recurrent(2, t, 32),
                                      [64, 128, 256, 512, 1024, 2048])):
                for t in tokens:
                    case = make(t)
                    res["sweep"].setdefault(op, []).append(
                        (t, timer.gpu_ms(case.cula, reps=10), timer.gpu_ms(lambda: case.fla(fla), reps=10)
                         if fla else None))

    save(final=True)
    print(f"bench: wrote {out / (name + '.md')} and .json" + (" and .png" if "sweep" in parts else ""))
    return 0


def load_saved(path: Path, gpu: str, backend: str, fla_text: str, variants: list[str]) -> dict:
    """The rows of earlier runs (a partial run keeps them), if they were taken on this GPU model with
    this backend, FLA and kernel variants."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if (saved.get("gpu"), saved.get("backend"), saved.get("fla"), saved.get("variants")) != \
            (gpu, backend, fla_text, variants):
        print(f"bench: {path} holds another GPU, backend, FLA or variants; starting afresh", file=sys.stderr)
        return {}
    return saved


def host_calls(fla) -> list:
    """(label, cula call, FLA call or None) per op, on small inputs: what a serving loop's host pays."""
    d1 = Decode(1)
    tiny = Decode(1, heads=1, dim=64)
    out = torch.empty_like(d1.v)
    tiny_seq, tiny_rec = Prefill(1, 1, 1, dim=64), Recurrent(1, 1, 1, dim=64)
    gdn, gdn_dec = GdnPrefill(1, 1, 1, 1, dim=64), GdnDecode(1, 1, 1, dim=64)
    g_tok = tiny_seq.kw["g_gamma"].expand(1, 1, 1).contiguous()
    g_dec = g_tok[:, 0]  # (made once: a slice per call would be timed with the op)
    seq, dec = "(B=1 T=1 H=1 D=64)", "(N=1 H=1 D=64)"
    gdn_text = "(B=1 T=1 H=HV=1 D=64, l2norm, state)"
    kda, kda_dec, kda_chunks = KdaPrefill(1, 1, 1), KdaDecode(1, 1), KdaPrefill(1, 64, 1)
    kda.rec_kw = {name: x for name, x in kda.kw.items() if name != "safe_gate"}
    kda_text = "(B=1 T=1 H=HV=1, gates in the kernel, l2norm, state)"
    zeros = torch.zeros(64, device="cuda")
    return [
        ("torch.add, one elementwise launch through torch (reference)",
         lambda: torch.add(zeros, zeros, out=zeros), None),
        ("simple_gla_decode N=1 H=32", d1.cula, lambda: d1.fla(fla)),
        ("simple_gla_decode N=1 H=32 into a preallocated out=",
         lambda: cula.simple_gla_decode(d1.q, d1.k, d1.v, d1.pool, g_gamma=d1.g, out=out), None),
        (f"simple_gla_decode {dec}", tiny.cula, lambda: tiny.fla(fla)),
        (f"simple_gla_decode g= {dec}",
         lambda: cula.simple_gla_decode(tiny.q, tiny.k, tiny.v, tiny.pool, g=g_dec), None),
        (f"chunk_simple_gla {seq}", tiny_seq.cula, lambda: tiny_seq.fla(fla)),
        (f"chunk_simple_gla g= {seq}", lambda: cula.chunk_simple_gla(tiny_seq.q, tiny_seq.k, tiny_seq.v, g=g_tok),
         None),
        (f"fused_recurrent_simple_gla {seq}", tiny_rec.cula, lambda: tiny_rec.fla(fla)),
        (f"fused_recurrent_simple_gla g= {seq}",
         lambda: cula.fused_recurrent_simple_gla(tiny_seq.q, tiny_seq.k, tiny_seq.v, g=g_tok), None),
        (f"chunk_lightning_attn {seq}", lambda: cula.chunk_lightning_attn(tiny_seq.q, tiny_seq.k, tiny_seq.v, 1, 4),
         None),
        (f"fused_recurrent_lightning_attn {seq}",
         lambda: cula.fused_recurrent_lightning_attn(tiny_seq.q, tiny_seq.k, tiny_seq.v, 1, 4), None),
        (f"lightning_attn_decode {dec}",
         lambda: cula.lightning_attn_decode(tiny.q, tiny.k, tiny.v, tiny.pool, 1, 4), None),
        (f"chunk_gated_delta_rule {gdn_text}", gdn.cula, lambda: gdn.fla(fla)),
        (f"fused_recurrent_gated_delta_rule {gdn_text}",
         lambda: cula.fused_recurrent_gated_delta_rule(gdn.q, gdn.k, gdn.v, gdn.g, beta=gdn.beta, **gdn.kw),
         lambda: fla["gdn_recurrent"](gdn.q, gdn.k, gdn.v, gdn.g, beta=gdn.beta, **gdn.kw)),
        (f"gated_delta_rule_decode {gdn_text}", gdn_dec.cula, lambda: gdn_dec.fla(fla)),
        (f"chunk_kda {kda_text}: the token loop, one launch", kda.cula, lambda: kda.fla(fla)),
        (f"chunk_kda {kda_text.replace('T=1', 'T=64')}: the chunked kernels, two launches", kda_chunks.cula,
         lambda: kda_chunks.fla(fla)),
        (f"fused_recurrent_kda {kda_text}",
         lambda: cula.fused_recurrent_kda(kda.q, kda.k, kda.v, kda.g, kda.beta, **kda.rec_kw),
         lambda: fla["kda_recurrent"](kda.q, kda.k, kda.v, kda.g, kda.beta, **kda.rec_kw)),
        (f"kda_decode {kda_text}", kda_dec.cula, lambda: kda_dec.fla(fla)),
    ]


def plot(sweep: dict, path: Path, title: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench: matplotlib not installed; no plot", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, len(sweep), figsize=(6 * len(sweep), 4.5))
    for ax, (op, points) in zip(axes if len(sweep) > 1 else [axes], sweep.items(), strict=True):
        ts = [p[0] for p in points]
        ax.plot(ts, [p[1] for p in points], "o-", label="cula")
        if points[0][2] is not None:
            ax.plot(ts, [p[2] for p in points], "s--", label="FLA")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("T (tokens per sequence)")
        ax.set_ylabel("ms per call")
        ax.set_title(op)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
