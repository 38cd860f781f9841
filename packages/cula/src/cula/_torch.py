"""cula's ops as PyTorch custom ops (``torch.library``, namespace ``cula``), for torch.compile.

Eager calls never go through here: they take the ops' own path (the C fast path for plain torch
tensors, ~5-10 us). While torch.compile traces, every public op instead calls its custom op
(``torch.ops.cula.<op>``), which the compiler keeps in the graph as one opaque node, with a fake
implementation for shapes and dtypes and the in-place state updates declared as mutations; at run
time the custom op runs the eager op.

torch stays optional: ``import cula`` does not import it. The ops are registered when torch is
there: at ``import cula`` if torch is already imported, otherwise right after torch's own import
finishes (a one-shot import hook), so that they exist before anything is traced.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
import threading
import warnings
from typing import Any

from . import _checks as C

__all__ = ["is_compiling", "watch"]


def _never() -> bool:
    return False


# torch.compiler.is_compiling once the ops are registered: the ops' first test, which Dynamo
# folds to True while tracing and which costs eager calls one Python call.
is_compiling = _never
_ops: dict[str, Any] = {}
_lock = threading.Lock()

# name: (schema, mutated arguments). The sequence ops return [o] or [o, final_state] (a custom op
# cannot return an optional tensor); the decode ops write o into `out` (allocated by the caller
# when not given) and return nothing, since a custom op's outputs may not alias its inputs.
_SEQ = "Tensor q, Tensor k, Tensor v"
_GDN_FLAGS = "bool use_qk_l2norm_in_kernel, bool use_beta_sigmoid_in_kernel, bool allow_neg_eigval, bool state_v_first"
_GATE = "bool use_gate_in_kernel, Tensor? A_log, Tensor? dt_bias"
SCHEMAS = {
    "chunk_simple_gla": (f"({_SEQ}, Tensor? g, Tensor? g_gamma, float? scale, Tensor? initial_state, "
                         "bool output_final_state, Tensor? cu_seqlens, Tensor? cu_seqlens_cpu) -> Tensor[]", ()),
    "fused_recurrent_simple_gla": (f"({_SEQ}, Tensor? g, Tensor? g_gamma, float? scale, Tensor? initial_state, "
                                   "bool output_final_state, Tensor? cu_seqlens) -> Tensor[]", ()),
    "simple_gla_decode": (f"({_SEQ}, Tensor(a!) state, Tensor? g_gamma, float? scale, Tensor? state_indices, "
                          "bool check_indices, Tensor? g, Tensor(b!) out) -> ()", ("state", "out")),
    "chunk_lightning_attn": (f"({_SEQ}, int layer_idx, int num_layers, float? scale, Tensor? initial_state, "
                             "bool output_final_state, Tensor? cu_seqlens) -> Tensor[]", ()),
    "fused_recurrent_lightning_attn": (f"({_SEQ}, int layer_idx, int num_layers, float? scale, "
                                       "Tensor? initial_state, bool output_final_state, Tensor? cu_seqlens) "
                                       "-> Tensor[]", ()),
    "lightning_attn_decode": (f"({_SEQ}, Tensor(a!) state, int layer_idx, int num_layers, float? scale, "
                              "Tensor? state_indices, bool check_indices, Tensor(b!) out) -> ()", ("state", "out")),
}


def _gated_schemas(chunk: str, recurrent: str, decode: str, gate: str) -> dict:
    """The custom ops of a delta-rule family (the gated delta rule, KDA): its chunk, fused_recurrent
    and decode entry points, `gate` the in-kernel gate's arguments."""
    return {
        chunk: (f"({_SEQ}, Tensor g, Tensor beta, float? scale, Tensor? initial_state, bool output_final_state, "
                f"{_GDN_FLAGS}, Tensor? cu_seqlens, Tensor? cu_seqlens_cpu, {gate}) -> Tensor[]", ()),
        recurrent: (f"({_SEQ}, Tensor? g, Tensor? beta, float? scale, Tensor? initial_state, "
                    f"bool output_final_state, {_GDN_FLAGS}, Tensor? cu_seqlens, {gate}) -> Tensor[]", ()),
        # vLLM's calls with a state pool (ssm_state_indices): the states go back to the pool, which is
        # written in place and declared so (a mutating custom op returns plain tensors: torch cannot
        # functionalize one that returns Tensor[]), or one state per token, returned, the pool only read.
        recurrent + "_pool": (f"({_SEQ}, Tensor? g, Tensor? beta, float? scale, Tensor(a!) initial_state, "
                              f"{_GDN_FLAGS}, Tensor? cu_seqlens, {gate}, Tensor ssm_state_indices, "
                              "Tensor? num_accepted_tokens, Tensor? retrieve_parent_token) -> Tensor",
                              ("initial_state",)),
        recurrent + "_per_token": (f"({_SEQ}, Tensor? g, Tensor? beta, float? scale, Tensor initial_state, "
                                   f"{_GDN_FLAGS}, Tensor? cu_seqlens, {gate}, Tensor ssm_state_indices, "
                                   "Tensor? num_accepted_tokens, Tensor? retrieve_parent_token) -> Tensor[]", ()),
        # SGLang's target verify (cula.sglang): the state after each token to the cache, declared mutated,
        # as the pool (written only with inplace_final_state: the final states back to it); returns o.
        recurrent + "_cache": (f"({_SEQ}, Tensor? g, Tensor? beta, float? scale, Tensor(a!) initial_state, "
                               f"{_GDN_FLAGS}, Tensor? cu_seqlens, {gate}, Tensor ssm_state_indices, "
                               "Tensor? num_accepted_tokens, Tensor? retrieve_parent_token, bool inplace_final_state, "
                               "Tensor(b!) intermediate_states_buffer, Tensor intermediate_state_indices, "
                               "int? cache_steps) -> Tensor", ("initial_state", "intermediate_states_buffer")),
        # SGLang's extend calls with a state pool (initial_state_indices): the final states back to the
        # pool, declared mutated, or the pool only read (inplace_update=False).
        chunk + "_pool": (f"({_SEQ}, Tensor g, Tensor beta, float? scale, Tensor(a!) initial_state, {_GDN_FLAGS}, "
                          f"Tensor? cu_seqlens, Tensor? cu_seqlens_cpu, {gate}, Tensor initial_state_indices) "
                          "-> Tensor", ("initial_state",)),
        chunk + "_pool_read": (f"({_SEQ}, Tensor g, Tensor beta, float? scale, Tensor initial_state, {_GDN_FLAGS}, "
                               f"Tensor? cu_seqlens, Tensor? cu_seqlens_cpu, {gate}, Tensor initial_state_indices, "
                               "bool output_final_state) -> Tensor[]", ()),
        decode: (f"({_SEQ}, Tensor g, Tensor beta, Tensor(a!) state, float? scale, Tensor? state_indices, "
                 f"Tensor? num_accepted_tokens, {_GDN_FLAGS}, {gate}, bool check_indices, Tensor(b!) out) -> ()",
                 ("state", "out")),
    }


# (family module, chunk, fused_recurrent, decode, the in-kernel gate's extra arguments)
GATED = (("gated_delta_rule", "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "gated_delta_rule_decode",
          ()),
         ("kda", "chunk_kda", "fused_recurrent_kda", "kda_decode", ("lower_bound",)))
_EXTRA_SCHEMA = {"lower_bound": "float? lower_bound"}
for _family, _chunk, _rec, _dec, _extra in GATED:
    SCHEMAS.update(_gated_schemas(_chunk, _rec, _dec, ", ".join((_GATE, *(_EXTRA_SCHEMA[e] for e in _extra)))))


def _pair(r) -> list:
    """(o, final_state) as a custom op returns it: [o] or [o, final_state]."""
    o, ht = r
    return [o] if ht is None else [o, ht]


def _impls() -> dict:
    """The eager implementations: the public ops themselves (imported here, after cula's modules)."""
    from . import lightning_attn as la
    from . import simple_gla as sg

    def chunk_simple_gla(q, k, v, g, g_gamma, scale, initial_state, output_final_state, cu_seqlens, cu_seqlens_cpu):
        return _pair(sg.chunk_simple_gla(q, k, v, g=g, g_gamma=g_gamma, scale=scale, initial_state=initial_state,
                                         output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                         cu_seqlens_cpu=cu_seqlens_cpu))

    def fused_recurrent_simple_gla(q, k, v, g, g_gamma, scale, initial_state, output_final_state, cu_seqlens):
        return _pair(sg.fused_recurrent_simple_gla(q, k, v, g=g, g_gamma=g_gamma, scale=scale,
                                                   initial_state=initial_state, output_final_state=output_final_state,
                                                   cu_seqlens=cu_seqlens))

    def simple_gla_decode(q, k, v, state, g_gamma, scale, state_indices, check_indices, g, out):
        sg.simple_gla_decode(q, k, v, state, g_gamma=g_gamma, scale=scale, state_indices=state_indices,
                             check_indices=check_indices, out=out, g=g)

    def chunk_lightning_attn(q, k, v, layer_idx, num_layers, scale, initial_state, output_final_state, cu_seqlens):
        return _pair(la.chunk_lightning_attn(q, k, v, layer_idx, num_layers, scale=scale, initial_state=initial_state,
                                             output_final_state=output_final_state, cu_seqlens=cu_seqlens))

    def fused_recurrent_lightning_attn(q, k, v, layer_idx, num_layers, scale, initial_state, output_final_state,
                                       cu_seqlens):
        return _pair(la.fused_recurrent_lightning_attn(q, k, v, layer_idx, num_layers, scale=scale,
                                                       initial_state=initial_state,
                                                       output_final_state=output_final_state, cu_seqlens=cu_seqlens))

    def lightning_attn_decode(q, k, v, state, layer_idx, num_layers, scale, state_indices, check_indices, out):
        la.lightning_attn_decode(q, k, v, state, layer_idx, num_layers, scale=scale, state_indices=state_indices,
                                 check_indices=check_indices, out=out)

    fns = locals()
    impls = {name: fns[name] for name in SCHEMAS if name in fns}
    for family, chunk, rec, dec, extra in GATED:
        impls.update(_gated_impls(importlib.import_module(f".{family}", __package__), chunk, rec, dec, extra))
    return impls


def _gated_impls(mod, chunk: str, recurrent: str, decode: str, extra: tuple) -> dict:
    """A delta-rule family's implementations: its public ops, the arguments by keyword. `extra`, the
    in-kernel gate's arguments past dt_bias, follow it in each schema."""
    from . import _gated

    def take(args, at):  # (the arguments without the extra ones at `at`, the extra ones by name)
        return args[:at] + args[at + len(extra):], dict(zip(extra, args[at:at + len(extra)], strict=True))

    def chunk_op(*args):
        (q, k, v, g, beta, scale, initial_state, output_final_state, l2norm, sigmoid, neg, v_first, cu_seqlens,
         cu_seqlens_cpu, use_gate_in_kernel, A_log, dt_bias), more = take(args, 17)
        return _pair(getattr(mod, chunk)(
            q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
            use_qk_l2norm_in_kernel=l2norm, use_beta_sigmoid_in_kernel=sigmoid, allow_neg_eigval=neg,
            state_v_first=v_first, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu,
            use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias, **more))

    def recurrent_op(*args):
        (q, k, v, g, beta, scale, initial_state, output_final_state, l2norm, sigmoid, neg, v_first, cu_seqlens,
         use_gate_in_kernel, A_log, dt_bias), more = take(args, 16)
        return _pair(getattr(mod, recurrent)(
            q, k, v, g=g, beta=beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
            use_qk_l2norm_in_kernel=l2norm, use_beta_sigmoid_in_kernel=sigmoid, allow_neg_eigval=neg,
            state_v_first=v_first, cu_seqlens=cu_seqlens, use_gate_in_kernel=use_gate_in_kernel, A_log=A_log,
            dt_bias=dt_bias, **more))

    def pool_call(in_place, args):
        (q, k, v, g, beta, scale, initial_state, l2norm, sigmoid, neg, v_first, cu_seqlens, use_gate_in_kernel, A_log,
         dt_bias, ssm_state_indices, num_accepted_tokens, retrieve_parent_token), more = take(args, 15)
        return getattr(mod, recurrent)(
            q, k, v, g=g, beta=beta, scale=scale, initial_state=initial_state, use_qk_l2norm_in_kernel=l2norm,
            use_beta_sigmoid_in_kernel=sigmoid, allow_neg_eigval=neg, state_v_first=v_first, cu_seqlens=cu_seqlens,
            use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias, inplace_final_state=in_place,
            ssm_state_indices=ssm_state_indices, num_accepted_tokens=num_accepted_tokens,
            retrieve_parent_token=retrieve_parent_token, **more)

    def cache_call(*args):  # (no public op takes the cache: the recurrence with it, as cula.sglang calls it)
        (q, k, v, g, beta, scale, initial_state, l2norm, sigmoid, neg, v_first, cu_seqlens, use_gate_in_kernel, A_log,
         dt_bias, ssm_state_indices, num_accepted_tokens, retrieve_parent_token, in_place, buf, buf_indices,
         steps), more = take(args, 15)
        return _gated.recurrence_call(
            recurrent, q, k, v, g, beta, scale, initial_state, False, l2norm, use_gate_in_kernel, A_log, dt_bias,
            sigmoid, neg, cu_seqlens, in_place, ssm_state_indices, num_accepted_tokens, per_key=bool(extra),
            lower_bound=more.get("lower_bound"), v_first=v_first, retrieve_parent_token=retrieve_parent_token,
            cache=(buf, buf_indices, steps))[0]

    def chunk_pool_call(in_place, output_final_state, args):
        (q, k, v, g, beta, scale, initial_state, l2norm, sigmoid, neg, v_first, cu_seqlens, cu_seqlens_cpu,
         use_gate_in_kernel, A_log, dt_bias, initial_state_indices), more = take(args, 16)
        return getattr(mod, chunk)(
            q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
            use_qk_l2norm_in_kernel=l2norm, use_beta_sigmoid_in_kernel=sigmoid, allow_neg_eigval=neg,
            state_v_first=v_first, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu,
            use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias,
            initial_state_indices=initial_state_indices, inplace_update=in_place, **more)

    def decode_op(*args):
        (q, k, v, g, beta, state, scale, state_indices, num_accepted_tokens, l2norm, sigmoid, neg, v_first,
         use_gate_in_kernel, A_log, dt_bias, check_indices, out), more = take(args, 16)
        getattr(mod, decode)(q, k, v, g, beta, state, scale=scale, state_indices=state_indices,
                             num_accepted_tokens=num_accepted_tokens, use_qk_l2norm_in_kernel=l2norm,
                             use_beta_sigmoid_in_kernel=sigmoid, allow_neg_eigval=neg, state_v_first=v_first,
                             check_indices=check_indices,
                             out=out, use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias, **more)

    return {chunk: chunk_op, recurrent: recurrent_op,
            recurrent + "_pool": lambda *args: pool_call(True, args)[0],  # the final states are the pool itself
            recurrent + "_per_token": lambda *args: list(pool_call(False, args)), recurrent + "_cache": cache_call,
            chunk + "_pool": lambda *args: chunk_pool_call(True, False, args)[0],
            chunk + "_pool_read": lambda *args: _pair(chunk_pool_call(False, args[-1], args[:-1])), decode: decode_op}


def _fakes(torch) -> dict:
    """Output shapes and dtypes, for the compiler: o like v (contiguous), states float32."""

    def states(q, v, n):
        return v.new_empty((n, v.shape[-2], q.shape[-1], v.shape[-1]), dtype=torch.float32)

    def sequence(q, v, initial_state, output_final_state, cu_seqlens):
        o = v.new_empty(v.shape)
        if not output_final_state:
            return [o]
        return [o, states(q, v, q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1)]

    def simple_gla(q, k, v, g, g_gamma, scale, initial_state, output_final_state, cu_seqlens, cu_seqlens_cpu=None):
        return sequence(q, v, initial_state, output_final_state, cu_seqlens)

    def lightning(q, k, v, layer_idx, num_layers, scale, initial_state, output_final_state, cu_seqlens):
        return sequence(q, v, initial_state, output_final_state, cu_seqlens)

    def gated(q, k, v, g, beta, scale, initial_state, output_final_state, *rest):
        cu_seqlens = rest[4]  # (after the four flags of _GDN_FLAGS)
        return sequence(q, v, initial_state, output_final_state, cu_seqlens)

    def pool(q, k, v, *rest):
        return v.new_empty(v.shape)

    def pool_read(q, k, v, g, beta, scale, initial_state, *rest):
        cu_seqlens, output_final_state = rest[4], rest[-1]  # (after the four flags of _GDN_FLAGS)
        return sequence(q, v, initial_state, output_final_state, cu_seqlens)

    def per_token(q, k, v, *rest):
        return [v.new_empty(v.shape), states(q, v, v.shape[0] * v.shape[1])]

    def nothing(*args):
        return None

    fakes = {"chunk_simple_gla": simple_gla, "fused_recurrent_simple_gla": simple_gla, "simple_gla_decode": nothing,
             "chunk_lightning_attn": lightning, "fused_recurrent_lightning_attn": lightning,
             "lightning_attn_decode": nothing}
    for _, chunk, rec, dec, _ in GATED:
        fakes.update({chunk: gated, rec: gated, rec + "_pool": pool, rec + "_per_token": per_token,
                      rec + "_cache": pool, dec: nothing, chunk + "_pool": pool, chunk + "_pool_read": pool_read})
    return fakes


def install(torch) -> None:
    """Registers the custom ops (once per process); torch without torch.library.custom_op (older
    than 2.5) keeps eager calls only."""
    global is_compiling
    with _lock:
        if _ops or not hasattr(torch.library, "custom_op") or not hasattr(torch, "compiler"):
            return
        impls, fakes = _impls(), _fakes(torch)
        for name, (schema, mutates) in SCHEMAS.items():
            op = torch.library.custom_op(f"cula::{name}", impls[name], mutates_args=mutates, schema=schema)
            op.register_fake(fakes[name])
            _ops[name] = getattr(torch.ops.cula, name).default
        is_compiling = torch.compiler.is_compiling


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asked for `torch`, it wraps the loader that the other finders give so
    that install() runs right after torch's module has executed. It stays in sys.meta_path until
    then: a find_spec("torch") that imports nothing (cula's loader reads torch's version that way)
    must not use it up."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if finder is not self and find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_install(module):
            exec_module(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            _install_quietly(module)

        loader.exec_module = exec_then_install
        return spec


def _install_quietly(torch) -> None:
    try:
        install(torch)
    except Exception as e:  # never break torch's import or cula's: eager calls do not need the ops
        warnings.warn(f"cula: torch.compile support is off, registering cula's custom ops failed: {e!r}",
                      RuntimeWarning, stacklevel=2)


def watch() -> None:
    """From ``import cula``: registers the ops now if torch is imported, else when it is."""
    torch = sys.modules.get("torch")
    if torch is not None:
        if hasattr(torch, "library"):  # (not while torch itself is half imported)
            _install_quietly(torch)
    elif not any(isinstance(f, _AfterTorch) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorch())


# What the public ops call while torch.compile traces them.

def check_scale(scale: Any) -> float | None:
    """scale as the custom op takes it (None: K^-0.5, worked out by the eager op)."""
    return None if scale is None else C.check_scale(scale, 1)


def check_flags(**flags: Any) -> None:
    for name, value in flags.items():
        C.check_flag(value, name)


def call(name: str, *args: Any):
    """A custom op by name, as registered."""
    return _ops[name](*args)


def sequence(name: str, output_final_state: bool, *args: Any):
    """A sequence op's custom op: returns (o, final_state or None) as the eager op does."""
    r = _ops[name](*args)
    return r[0], (r[1] if output_final_state else None)


def decode(name: str, out: Any, v: Any, *args: Any):
    """A decode op's custom op, writing o into `out` (a new array like v when None); returns it."""
    if out is None:
        out = v.new_empty(v.shape)
    _ops[name](*args, out)
    return out
