"""cula's torch custom ops on the CPU (the installed wheels, CPU torch): registered whether torch is
imported before or after cula, never imported by cula itself; torch.compile(fullgraph=True) traces
every public op into its custom op with no graph break, with the output shapes and dtypes of the
fake implementations; options cula does not take still raise, naming the argument. The GPU side
(the compiled call equals the eager one, opcheck, CUDA graphs) is tests/gpu/test_torch_integration.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import cula  # noqa: E402
from cula import _torch  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::cula.CulaBackendWarning")


def _python(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CULA_")}
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_import_cula_imports_neither_torch_nor_fla():
    assert _python("import sys, cula; print([m for m in ('torch', 'fla') if m in sys.modules])") == "[]"


IMPORTS = {"torch first": "import torch, cula", "cula first": "import cula, torch",
           # a find_spec that imports nothing (cula's loader reads torch's version so) leaves the hook
           "cula, find_spec, torch": "import cula, importlib.util; importlib.util.find_spec('torch'); "
                                     "cula._loader.torch_cuda_major(); import torch"}


@pytest.mark.parametrize("order", list(IMPORTS))
def test_ops_registered_in_either_import_order(order):
    """Imported before torch, cula registers its ops right after torch's own import (an import
    hook); imported after, at once. Either way they exist before anything is traced."""
    imports = IMPORTS[order]
    code = f"{imports}; print(sorted(n for n in cula._torch.SCHEMAS if hasattr(torch.ops.cula, n)))"
    assert _python(code) == str(sorted(_torch.SCHEMAS))


def test_schemas_declare_what_is_written():
    """One op per entry point under the cula namespace, its schema as written, with the arguments
    it writes (the state pools, out) declared as mutated."""
    for name, (schema, mutates) in _torch.SCHEMAS.items():
        op = getattr(torch.ops.cula, name).default
        assert str(op._schema) == f"cula::{name}{schema}", name
        written = {a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write}
        assert written == set(mutates), name


N, T, H, HV, D = 3, 70, 2, 4, 64
META = "meta"


def _t(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, device=META, dtype=dtype)


def _x():
    return dict(q=_t(N, T, H, D), v=_t(N, T, H, D), vv=_t(N, T, HV, D), g=_t(N, T, HV, dtype=torch.float32),
                gh=_t(N, T, H, dtype=torch.float32), beta=_t(N, T, HV, dtype=torch.float32),
                gamma=_t(H, dtype=torch.float32), h0=_t(N, H, D, D, dtype=torch.float32),
                h0v=_t(N, HV, D, D, dtype=torch.float32), pool=_t(8, H, D, D, dtype=torch.float32),
                poolv=_t(10, HV, D, D, dtype=torch.float32), slots=_t(N, dtype=torch.int32),
                slots2=_t(N, 3, dtype=torch.int64), slots4=_t(4, dtype=torch.int64), cu=_t(5, dtype=torch.int32),
                hv=_t(HV, dtype=torch.float32), gk=_t(N, T, HV, D, dtype=torch.float32),
                hvk=_t(HV * D, dtype=torch.float32))


def _one(x, name):
    return x[name].reshape(1, -1, *x[name].shape[2:])


# case: (the call, the custom ops it must make, the shapes (and dtypes) of what it returns)
STATE_F32 = torch.float32
CASES = {
    "chunk_simple_gla": (lambda x: cula.chunk_simple_gla(x["q"], x["q"], x["v"], g_gamma=x["gamma"],
                                                         initial_state=x["h0"], output_final_state=True),
                         ["chunk_simple_gla"], [((N, T, H, D), torch.bfloat16), ((N, H, D, D), STATE_F32)]),
    "chunk_simple_gla_g_varlen": (lambda x: cula.chunk_simple_gla(
        _one(x, "q"), _one(x, "q"), _one(x, "v"), g=_one(x, "gh"), cu_seqlens=x["cu"], output_final_state=True),
        ["chunk_simple_gla"], [((1, N * T, H, D), torch.bfloat16), ((4, H, D, D), STATE_F32)]),
    "fused_recurrent_simple_gla": (lambda x: cula.fused_recurrent_simple_gla(x["q"], x["q"], x["v"],
                                                                             g_gamma=x["gamma"], scale=1),
                                   ["fused_recurrent_simple_gla"], [((N, T, H, D), torch.bfloat16), None]),
    "simple_gla_decode": (lambda x: cula.simple_gla_decode(x["q"][:, 0], x["q"][:, 0], x["v"][:, 0], x["pool"],
                                                           g_gamma=x["gamma"], state_indices=x["slots"]),
                          ["simple_gla_decode"], [((N, H, D), torch.bfloat16)]),
    "chunk_lightning_attn": (lambda x: cula.chunk_lightning_attn(x["q"], x["q"], x["v"], 2, 8, output_final_state=True),
                             ["chunk_lightning_attn"], [((N, T, H, D), torch.bfloat16), ((N, H, D, D), STATE_F32)]),
    "fused_recurrent_lightning_attn": (lambda x: cula.fused_recurrent_lightning_attn(x["q"], x["q"], x["v"], 2, 8),
                                       ["fused_recurrent_lightning_attn"], [((N, T, H, D), torch.bfloat16), None]),
    "lightning_attn_decode": (lambda x: cula.lightning_attn_decode(x["q"][:, 0], x["q"][:, 0], x["v"][:, 0],
                                                                   x["pool"], 2, 8, out=x["v"][:, 0]),
                              ["lightning_attn_decode"], [((N, H, D), torch.bfloat16)]),
    "chunk_gated_delta_rule": (lambda x: cula.chunk_gated_delta_rule(
        _one(x, "q"), _one(x, "q"), _one(x, "vv"), _one(x, "g"), _one(x, "beta"), output_final_state=True,
        cu_seqlens=x["cu"], use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=x["hv"], dt_bias=x["hv"],
        head_first=False, chunk_size=64),
        ["chunk_gated_delta_rule"], [((1, N * T, HV, D), torch.bfloat16), ((4, HV, D, D), STATE_F32)]),
    "fused_recurrent_gated_delta_rule": (lambda x: cula.fused_recurrent_gated_delta_rule(
        x["q"], x["q"], x["vv"], g=x["g"], beta=x["beta"], initial_state=x["h0v"], output_final_state=True),
        ["fused_recurrent_gated_delta_rule"], [((N, T, HV, D), torch.bfloat16), ((N, HV, D, D), STATE_F32)]),
    "fused_recurrent_gated_delta_rule_pool": (lambda x: cula.fused_recurrent_gated_delta_rule(
        _one(x, "q"), _one(x, "q"), _one(x, "vv"), g=_one(x, "g"), beta=_one(x, "beta"), initial_state=x["poolv"],
        cu_seqlens=x["cu"], ssm_state_indices=x["slots2"], num_accepted_tokens=x["slots"]),
        ["fused_recurrent_gated_delta_rule_pool"], [((1, N * T, HV, D), torch.bfloat16), ((10, HV, D, D), STATE_F32)]),
    "fused_recurrent_gated_delta_rule_per_token": (lambda x: cula.fused_recurrent_gated_delta_rule(
        x["q"], x["q"], x["vv"], g=x["g"], beta=x["beta"], initial_state=x["poolv"], ssm_state_indices=x["slots"],
        inplace_final_state=False),
        ["fused_recurrent_gated_delta_rule_per_token"],
        [((N, T, HV, D), torch.bfloat16), ((N * T, HV, D, D), STATE_F32)]),
    "gated_delta_rule_decode": (lambda x: cula.gated_delta_rule_decode(
        x["q"][:, :2], x["q"][:, :2], x["vv"][:, :2], x["g"][:, :2], x["beta"][:, :2], x["poolv"],
        state_indices=x["slots2"], num_accepted_tokens=x["slots"], use_qk_l2norm_in_kernel=True),
        ["gated_delta_rule_decode"], [((N, 2, HV, D), torch.bfloat16)]),
    "chunk_kda": (lambda x: cula.chunk_kda(
        _one(x, "q"), _one(x, "q"), _one(x, "vv"), _one(x, "gk"), _one(x, "beta"), output_final_state=True,
        cu_seqlens=x["cu"], use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, safe_gate=True, lower_bound=-5.0,
        A_log=x["hv"], dt_bias=x["hvk"], use_beta_sigmoid_in_kernel=True),
        ["chunk_kda"], [((1, N * T, HV, D), torch.bfloat16), ((4, HV, D, D), STATE_F32)]),
    "fused_recurrent_kda": (lambda x: cula.fused_recurrent_kda(
        x["q"], x["q"], x["vv"], x["gk"], x["beta"], initial_state=x["h0v"], output_final_state=True),
        ["fused_recurrent_kda"], [((N, T, HV, D), torch.bfloat16), ((N, HV, D, D), STATE_F32)]),
    "fused_recurrent_kda_pool_out": (lambda x: cula.fused_recurrent_kda(
        _one(x, "q"), _one(x, "q"), _one(x, "vv"), _one(x, "gk"), _one(x, "beta"), initial_state=x["poolv"],
        cu_seqlens=x["cu"], ssm_state_indices=x["slots2"], num_accepted_tokens=x["slots"], out=_one(x, "vv")),
        ["fused_recurrent_kda_pool"], [((1, N * T, HV, D), torch.bfloat16), ((10, HV, D, D), STATE_F32)]),
    "fused_recurrent_kda_per_token": (lambda x: cula.fused_recurrent_kda(
        x["q"], x["q"], x["vv"], x["gk"], x["beta"], initial_state=x["poolv"], ssm_state_indices=x["slots"],
        inplace_final_state=False, use_gate_in_kernel=True, dt_bias=x["hvk"], lower_bound=-3.0),
        ["fused_recurrent_kda_per_token"], [((N, T, HV, D), torch.bfloat16), ((N * T, HV, D, D), STATE_F32)]),
    # SGLang's extend: the pool read at [N] slots and written in place, or only read
    "chunk_gated_delta_rule_pool": (lambda x: cula.chunk_gated_delta_rule(
        _one(x, "q"), _one(x, "q"), _one(x, "vv"), _one(x, "g"), _one(x, "beta"), initial_state=x["poolv"],
        initial_state_indices=x["slots4"], cu_seqlens=x["cu"], state_v_first=True, head_first=False),
        ["chunk_gated_delta_rule_pool"], [((1, N * T, HV, D), torch.bfloat16), ((10, HV, D, D), STATE_F32)]),
    "chunk_kda_pool_read": (lambda x: cula.chunk_kda(
        _one(x, "q"), _one(x, "q"), _one(x, "vv"), _one(x, "gk"), _one(x, "beta"), initial_state=x["poolv"],
        initial_state_indices=x["slots4"], inplace_update=False, output_final_state=True, cu_seqlens=x["cu"],
        use_gate_in_kernel=True, dt_bias=x["hvk"], lower_bound=-3.0),
        ["chunk_kda_pool_read"], [((1, N * T, HV, D), torch.bfloat16), ((4, HV, D, D), STATE_F32)]),
    "kda_decode": (lambda x: cula.kda_decode(
        x["q"][:, 0], x["q"][:, 0], x["vv"][:, 0], x["gk"][:, 0], x["beta"][:, 0], x["poolv"],
        state_indices=x["slots"], use_qk_l2norm_in_kernel=True),
        ["kda_decode"], [((N, HV, D), torch.bfloat16)]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_compile_fullgraph_traces_the_custom_op(case):
    """fullgraph=True: any graph break fails. The graph holds the op's custom op and no other call
    into cula; the results have the fake implementation's shapes and dtypes (run on meta tensors)."""
    fn, ops, want = CASES[case]
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    got = torch.compile(fn, fullgraph=True, backend=backend)(_x())
    assert len(graphs) == 1
    called = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function" and "cula" in str(n.target)]
    assert called == [f"cula.{op}.default" for op in ops], called
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if w is None:
            assert g is None, f"{case}[{i}]"
            continue
        assert (tuple(g.shape), g.dtype) == w, f"{case}[{i}]: {tuple(g.shape)} {g.dtype}, expected {w}"


@pytest.mark.parametrize("case", list(CASES))
def test_compile_functionalizes(case):
    """Through AOTAutograd (aot_eager, as Inductor does): the ops that write their arguments must be
    ones torch can functionalize (a mutating custom op returning Tensor[] is not), and the compiled
    call returns what the fake implementations give."""
    fn, _, want = CASES[case]
    torch._dynamo.reset()
    got = torch.compile(fn, fullgraph=True, backend="aot_eager")(_x())
    got = got if isinstance(got, tuple) else (got,)
    assert [None if g is None else (tuple(g.shape), g.dtype) for g in got] == want


@pytest.mark.parametrize("case", ["fused_recurrent_gated_delta_rule_pool", "chunk_gated_delta_rule_pool"])
def test_in_place_pool_is_returned_as_final_state(case):
    """vLLM's call with inplace_final_state (and SGLang's with inplace_update) returns the pool itself
    as final_state, traced or not."""
    fn = CASES[case][0]
    torch._dynamo.reset()
    x = _x()
    _, ht = torch.compile(fn, fullgraph=True, backend="eager")(x)
    assert ht is x["poolv"]


@pytest.mark.parametrize("call, name, error", [
    (lambda x: cula.chunk_simple_gla(x["q"], x["q"], x["v"], output_final_state=1), "output_final_state", TypeError),
    (lambda x: cula.chunk_simple_gla(x["q"], x["q"], x["v"], scale="0.1"), "scale", TypeError),
    (lambda x: cula.fused_recurrent_simple_gla(x["q"], x["q"], x["v"], reverse=True), "reverse", NotImplementedError),
    (lambda x: cula.chunk_simple_gla(x["q"], x["q"], x["v"], state_v_first=True), "state_v_first",
     NotImplementedError),
    (lambda x: cula.chunk_gated_delta_rule(x["q"], x["q"], x["vv"], x["g"], x["beta"], bogus=1), "bogus", TypeError),
    (lambda x: cula.gated_delta_rule_decode(x["q"][:, 0], x["q"][:, 0], x["vv"][:, 0], x["g"][:, 0], x["beta"][:, 0],
                                            x["poolv"], check_indices=None), "check_indices", TypeError),
    (lambda x: cula.fused_recurrent_gated_delta_rule(x["q"], x["q"], x["vv"], g=x["g"], beta=x["beta"],
                                                     ssm_state_indices=x["slots"]), "initial_state", ValueError),
    (lambda x: cula.chunk_kda(x["q"], x["q"], x["vv"], x["gk"], x["beta"], use_gate_in_kernel=True, safe_gate=True,
                              lower_bound=-6.0, A_log=x["hv"], dt_bias=x["hvk"]), "lower_bound", ValueError),
    (lambda x: cula.kda_decode(x["q"][:, 0], x["q"][:, 0], x["vv"][:, 0], x["gk"][:, 0], x["beta"][:, 0], x["poolv"],
                               lower_bound="-1"), "lower_bound", TypeError),
    (lambda x: cula.fused_recurrent_kda(x["q"], x["q"], x["vv"], x["gk"], x["beta"], out=x["q"]), "out", ValueError),
])
def test_compile_keeps_the_errors(call, name, error):
    """What eager calls reject is rejected while tracing too, with the same message naming the
    argument (fullgraph=True reports it as Dynamo's Unsupported, our error its cause's text)."""
    torch._dynamo.reset()
    with pytest.raises(Exception) as raised:
        torch.compile(call, fullgraph=True, backend="eager")(_x())
    text = str(raised.value)
    assert f"{error.__name__}(" in text and name in text and "cula" in text, text
