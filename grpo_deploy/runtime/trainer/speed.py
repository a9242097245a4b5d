"""The trainer's speed switches (frozen base weights in bf16, Liger's fused RMSNorm/SwiGLU/RoPE kernels, regional
torch.compile of each decoder layer around the attention shim), applied to a built LoRA policy, and the compile
counters the bench reports. No switch touches a LoRA weight: those stay fp32 master weights."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

# fp32: today's path (fp32 master weights everywhere, autocast rounds each frozen linear weight to bf16 per call).
# bf16-linear: the frozen weights of the decoder's linear layers stored in bf16, the values autocast would have made,
#   so the products are the same; embeddings, norms and the residual stream stay fp32.
# bf16: every frozen weight in bf16 (embeddings and norms too), so the residual stream runs in bf16 as in a model
#   loaded with dtype=bfloat16.
BASE_DTYPES = ("fp32", "bf16-linear", "bf16")
FUSED_KERNELS = ("off", "liger")


@dataclass(frozen=True)
class Switches:
    """One combination of the speed switches (a hardware profile's `runtime` settings of the same names)."""

    base_dtype: str = "fp32"
    fused_kernels: str = "off"
    compile_layers: bool = False
    lora_elementwise: bool = False

    def __post_init__(self):
        if self.base_dtype not in BASE_DTYPES:
            raise ValueError(f"base_dtype must be one of {', '.join(BASE_DTYPES)}, not {self.base_dtype!r}")
        if self.fused_kernels not in FUSED_KERNELS:
            raise ValueError(f"fused_kernels must be one of {', '.join(FUSED_KERNELS)}, not {self.fused_kernels!r}")

    @property
    def label(self) -> str:
        parts = [p for p in (self.base_dtype if self.base_dtype != "fp32" else "",
                             self.fused_kernels if self.fused_kernels != "off" else "",
                             "compile" if self.compile_layers else "",
                             "lora-ew" if self.lora_elementwise else "") if p]
        return "+".join(parts) or "today"

    @classmethod
    def parse(cls, text: str) -> Switches:
        """`today`, or '+'-joined tokens: a base dtype (bf16-linear, bf16), `liger`, `compile`, `lora-ew`."""
        fields = {}
        for token in (t.strip() for t in text.split("+")):
            if token in ("", "today", "fp32"):
                continue
            if token in BASE_DTYPES:
                fields["base_dtype"] = token
            elif token in FUSED_KERNELS:
                fields["fused_kernels"] = token
            elif token == "compile":
                fields["compile_layers"] = True
            elif token == "lora-ew":
                fields["lora_elementwise"] = True
            else:
                raise ValueError(f"unknown speed switch {token!r}: use today, {', '.join(BASE_DTYPES[1:])}, liger, "
                                 "compile, lora-ew, joined by '+'")
        return cls(**fields)


def unavailable_reason(switches: Switches, device: str, autocast: bool) -> str | None:
    """Why these switches cannot run here, or None: bf16 weights need bf16 autocast (fp32 runs keep fp32 weights),
    Liger's kernels are Triton and need CUDA and the installed `liger_kernel` package (nothing is fetched)."""
    if switches.base_dtype != "fp32" and not autocast:
        return f"base_dtype {switches.base_dtype} needs bf16 autocast (this run is fp32)"
    if switches.lora_elementwise and not switches.compile_layers:
        return "lora-ew needs compile (eager, its broadcasts would be materialised)"
    if switches.fused_kernels == "liger":
        if device != "cuda":
            return "liger kernels are Triton kernels and need a CUDA device"
        if importlib.util.find_spec("liger_kernel") is None:
            return "the liger_kernel package is not installed"
    return None


def decoder_layers(model):
    """The decoder's layer list (a ModuleList named `layers`) under any PEFT or TRL wrapping."""
    import torch

    for name, module in model.named_modules():
        if name.split(".")[-1] == "layers" and isinstance(module, torch.nn.ModuleList):
            return module
    raise ValueError(f"{type(model).__name__} has no ModuleList named 'layers'")


def cast_base(model, base_dtype: str) -> int:
    """Store frozen weights in bf16 (bf16-linear: the decoder's linear layers only; bf16: every frozen floating
    weight); trainable (LoRA) weights are left as they are. Returns how many tensors were cast."""
    import torch

    if base_dtype == "fp32":
        return 0
    if base_dtype == "bf16-linear":
        modules = [m for m in decoder_layers(model).modules() if isinstance(m, torch.nn.Linear)]
    else:
        modules = list(model.modules())
    cast = 0
    for module in modules:
        for _, tensor in list(module.named_parameters(recurse=False)):
            if not tensor.requires_grad and tensor.is_floating_point() and tensor.dtype != torch.bfloat16:
                tensor.data = tensor.data.to(torch.bfloat16)
                cast += 1
    return cast


# --- Liger kernels, per instance (no class or module-wide patch), RoPE through one process-wide dispatcher ---------
_ROPE = {"fused": False, "original": None}


def _liger_norm_forward(norm):
    from liger_kernel.transformers.functional import liger_rms_norm

    def forward(hidden_states):
        return liger_rms_norm(hidden_states, norm.weight, norm.variance_epsilon, in_place=False)

    return forward


def _liger_mlp_forward(mlp):
    from liger_kernel.transformers.functional import liger_swiglu

    def forward(x):
        return mlp.down_proj(liger_swiglu(mlp.gate_proj(x), mlp.up_proj(x)))

    return forward


def _rope_dispatch(q, k, cos, sin, *args, **kwargs):
    """Qwen2's `apply_rotary_pos_emb`, through Liger's kernel while a policy with fused kernels is the last one set
    up in this process and the tensors are on CUDA."""
    if _ROPE["fused"] and q.is_cuda:
        from liger_kernel.transformers.functional import liger_rope

        return liger_rope(q, k, cos, sin)
    return _ROPE["original"](q, k, cos, sin, *args, **kwargs)


def _set_fused_rope(model, enabled: bool) -> None:
    import sys

    module = sys.modules.get(type(decoder_layers(model)[0].self_attn).__module__)
    if module is None or not hasattr(module, "apply_rotary_pos_emb"):
        return
    if _ROPE["original"] is None:
        _ROPE["original"] = module.apply_rotary_pos_emb
        module.apply_rotary_pos_emb = _rope_dispatch
    _ROPE["fused"] = enabled


def fuse_liger(model) -> int:
    """Route every RMSNorm and SiLU-gated MLP of this policy through Liger's Triton kernels; returns modules patched."""
    patched = 0
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon"):
            module.forward = _liger_norm_forward(module)
            patched += 1
        elif all(hasattr(module, p) for p in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            if getattr(getattr(module, "config", None), "hidden_act", "silu") in ("silu", "swish"):
                module.forward = _liger_mlp_forward(module)
                patched += 1
    return patched


# --- LoRA's thin products as elementwise work, for the compiler to fuse ----------------------------------------------
LORA_ELEMENTWISE_MAX_RANK = 4  # above this the products are no longer thin: PEFT's matrix products are kept


def _lora_elementwise_forward(module, adapter: str, original):
    """PEFT's vanilla LoRA `base(x) + B(A(x)) * scaling` with the rank-r products written as broadcasts and sums in
    fp32: compiled, the down-projection becomes a reduction fused with whatever produced x and the up-projection a
    broadcast fused into the add, instead of cuBLAS calls with an inner or outer dimension of r."""
    lora_a, lora_b = module.lora_A[adapter], module.lora_B[adapter]
    scaling = module.scaling[adapter]

    def forward(x, *args, **kwargs):
        if module.disable_adapters or module.merged or kwargs.get("adapter_names") is not None:
            return original(x, *args, **kwargs)
        result = module.base_layer(x, *args, **kwargs)
        xa = (x.float().unsqueeze(-2) * lora_a.weight).sum(-1)  # (..., r)
        delta = (xa.unsqueeze(-2) * lora_b.weight).sum(-1) * scaling  # (..., out)
        return (result.float() + delta).to(result.dtype)

    return forward


def lora_elementwise(model, max_rank: int = LORA_ELEMENTWISE_MAX_RANK) -> int:
    """Give every plain LoRA linear layer (one adapter, rank <= max_rank, no dropout, DoRA, bias or variant) the
    elementwise forward; returns the layers changed."""
    import torch
    from peft.tuners.lora import Linear as LoraLinear

    changed = 0
    for module in model.modules():
        if not isinstance(module, LoraLinear) or len(module.active_adapters) != 1:
            continue
        adapter = module.active_adapters[0]
        plain = (adapter in module.lora_A and module.r[adapter] <= max_rank
                 and isinstance(module.lora_dropout[adapter], torch.nn.Identity)
                 and not module.use_dora.get(adapter, False) and not getattr(module, "lora_bias", {}).get(adapter)
                 and adapter not in getattr(module, "lora_variant", {}))
        if plain:
            module.forward = _lora_elementwise_forward(module, adapter, module.forward)
            changed += 1
    return changed


# --- regional compile ------------------------------------------------------------------------------------------------
RECOMPILE_LIMIT = 64  # compiled variants kept per code object: rows of new lengths and a bench's several policies


def compile_layers(model) -> int:
    """torch.compile each decoder layer in place (its state-dict keys unchanged); the attention shim runs eagerly
    between the two compiled regions of a layer. Shapes are automatic-dynamic: one recompile when rows change
    length, none after. Returns the number of layers compiled."""
    import torch

    for name in ("recompile_limit", "cache_size_limit"):
        if getattr(torch._dynamo.config, name, RECOMPILE_LIMIT) < RECOMPILE_LIMIT:
            setattr(torch._dynamo.config, name, RECOMPILE_LIMIT)
    layers = decoder_layers(model)
    for layer in layers:
        layer.compile()
    return len(layers)


def apply(model, switches: Switches, device: str, autocast: bool) -> dict:
    """Apply the switches to a built policy (after PEFT wrapped it); returns what was done, for the report."""
    reason = unavailable_reason(switches, device, autocast)
    if reason:
        raise ValueError(reason)
    done = {"cast_tensors": cast_base(model, switches.base_dtype)}
    _set_fused_rope(model, switches.fused_kernels == "liger")
    done["liger_modules"] = fuse_liger(model) if switches.fused_kernels == "liger" else 0
    done["lora_elementwise"] = lora_elementwise(model) if switches.lora_elementwise else 0
    if switches.lora_elementwise and not done["lora_elementwise"]:  # on, yet nothing to fuse: say so, do not hide it
        done["lora_elementwise_none"] = (f"no plain LoRA layer of rank <= {LORA_ELEMENTWISE_MAX_RANK} (one adapter, "
                                         "no dropout, DoRA or bias): PEFT's products kept")
    done["compiled_layers"] = compile_layers(model) if switches.compile_layers else 0
    return done


def graphs_compiled() -> int:
    """Graphs Dynamo has compiled in this process so far (first compiles and recompiles alike)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def reset_compiler() -> None:
    """Forget compiled code and turn Inductor's caches off, so the next compile's seconds are a cold start's."""
    import torch

    torch._dynamo.reset()
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = False
    try:
        import torch._functorch.config as functorch_config

        functorch_config.enable_autograd_cache = False
    except (ImportError, AttributeError):
        pass
