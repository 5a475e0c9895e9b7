"""A minimal Hugging Face -> Halyard weight mapping for the parity tests (halyard.export owns the real one).

Each function takes a `transformers` model and a Halyard model of the same shapes and returns the Halyard
model with every parameter replaced by the corresponding torch tensor, transposed and split into named
axes. Layers are stacked on the ``layers`` axis.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from halyard.models import (
    Gpt2,
    Gpt2Config,
    Llama,
    LlamaConfig,
    MistralConfig,
    Mixtral,
    MixtralConfig,
    Qwen2Config,
)
from halyard.models.rotary import RotaryConfig
from halyard.named import NamedArray


def _put(model: Any, where: Callable[[Any], NamedArray], value: np.ndarray) -> Any:
    old = where(model)
    if tuple(old.array.shape) != value.shape:
        raise ValueError(f"shape mismatch: halyard {old.axes} vs torch-derived {value.shape}")
    return eqx.tree_at(where, model, NamedArray(jnp.asarray(value, old.array.dtype), old.axes))


def _numpy(state: dict[str, Any], name: str) -> np.ndarray:
    return state[name].detach().cpu().numpy().astype(np.float32)


def _stack(
    state: dict[str, Any], pattern: str, num_layers: int, transform: Callable[[np.ndarray], np.ndarray]
) -> np.ndarray:
    return np.stack([transform(_numpy(state, pattern.format(i))) for i in range(num_layers)])


def rope_from_hf(hf_config: Any) -> RotaryConfig:
    """The RotaryConfig of a transformers config (v5 ``rope_parameters``)."""
    params = dict(hf_config.rope_parameters or {})
    theta = params.get("rope_theta", 10000.0)
    scaling = None if params.get("rope_type", "default") == "default" else params
    return RotaryConfig.from_hf(theta, scaling, params.get("partial_rotary_factor") or 1.0)


def llama_config_from_hf(hf_config: Any, **overrides: Any) -> LlamaConfig:
    """LlamaConfig / MistralConfig / Qwen2Config for a transformers config of those families."""
    cls = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config, "mixtral": MixtralConfig}[
        hf_config.model_type
    ]
    fields = dict(
        vocab_size=hf_config.vocab_size,
        hidden_size=hf_config.hidden_size,
        intermediate_size=hf_config.intermediate_size,
        num_layers=hf_config.num_hidden_layers,
        num_heads=hf_config.num_attention_heads,
        num_kv_heads=hf_config.num_key_value_heads,
        head_dim=getattr(hf_config, "head_dim", None),
        max_position=hf_config.max_position_embeddings,
        rope=rope_from_hf(hf_config),
        rms_norm_eps=hf_config.rms_norm_eps,
        tie_embeddings=hf_config.tie_word_embeddings,
        sliding_window=getattr(hf_config, "sliding_window", None),
        activation=hf_config.hidden_act,
    )
    if hf_config.model_type == "llama":
        fields.update(attention_bias=hf_config.attention_bias, mlp_bias=hf_config.mlp_bias)
    if hf_config.model_type == "mixtral":
        fields.update(
            num_experts=hf_config.num_local_experts,
            num_experts_per_token=hf_config.num_experts_per_tok,
            router_aux_loss_coef=hf_config.router_aux_loss_coef,
        )
    fields.update(overrides)
    return cls(**fields)


def load_llama(model: Llama | Mixtral, hf_model: Any) -> Llama | Mixtral:
    """Copy a transformers Llama/Mistral/Qwen2/Mixtral ``*ForCausalLM`` into ``model``."""
    config = model.config
    state = hf_model.state_dict()
    num_layers, heads, kv, size = config.num_layers, config.num_heads, config.num_kv_heads, config.head_size
    embed = config.hidden_size
    prefix = "model.layers.{}."

    def projection(count: int) -> Callable[[np.ndarray], np.ndarray]:
        return lambda w: w.T.reshape(embed, count, size)

    layers = lambda m: m.layers.layers
    model = _put(model, lambda m: m.embed.weight, _numpy(state, "model.embed_tokens.weight"))
    model = _put(model, lambda m: m.norm.weight, _numpy(state, "model.norm.weight"))
    if model.lm_head is not None:
        model = _put(model, lambda m: m.lm_head.weight, _numpy(state, "lm_head.weight").T)
    for ours, theirs, transform in [
        (lambda m: layers(m).input_norm.weight, "input_layernorm.weight", lambda w: w),
        (lambda m: layers(m).post_attention_norm.weight, "post_attention_layernorm.weight", lambda w: w),
        (lambda m: layers(m).attention.q_proj.weight, "self_attn.q_proj.weight", projection(heads)),
        (lambda m: layers(m).attention.k_proj.weight, "self_attn.k_proj.weight", projection(kv)),
        (lambda m: layers(m).attention.v_proj.weight, "self_attn.v_proj.weight", projection(kv)),
        (
            lambda m: layers(m).attention.o_proj.weight,
            "self_attn.o_proj.weight",
            lambda w: w.T.reshape(heads, size, embed),
        ),
    ]:
        model = _put(model, ours, _stack(state, prefix + theirs, num_layers, transform))
    if isinstance(model, Mixtral):
        mlp = config.intermediate_size
        mlp_entries = [
            (lambda m: layers(m).moe.router.weight, "mlp.gate.weight", lambda w: w.T),
            (
                lambda m: layers(m).moe.gate,
                "mlp.experts.gate_up_proj",
                lambda w: w[:, :mlp, :].transpose(0, 2, 1),
            ),
            (
                lambda m: layers(m).moe.up,
                "mlp.experts.gate_up_proj",
                lambda w: w[:, mlp:, :].transpose(0, 2, 1),
            ),
            (lambda m: layers(m).moe.down, "mlp.experts.down_proj", lambda w: w.transpose(0, 2, 1)),
        ]
    else:
        mlp_entries = [
            (lambda m: layers(m).mlp.gate.weight, "mlp.gate_proj.weight", lambda w: w.T),
            (lambda m: layers(m).mlp.up.weight, "mlp.up_proj.weight", lambda w: w.T),
            (lambda m: layers(m).mlp.down.weight, "mlp.down_proj.weight", lambda w: w.T),
        ]
    for ours, theirs, transform in mlp_entries:
        model = _put(model, ours, _stack(state, prefix + theirs, num_layers, transform))
    if config.attention_bias:
        for name, count in (("q_proj", heads), ("k_proj", kv), ("v_proj", kv)):
            model = _put(
                model,
                lambda m, name=name: getattr(layers(m).attention, name).bias,
                _stack(
                    state,
                    prefix + f"self_attn.{name}.bias",
                    num_layers,
                    lambda b, c=count: b.reshape(c, size),
                ),
            )
        if not config.qkv_bias_only:
            model = _put(
                model,
                lambda m: layers(m).attention.o_proj.bias,
                _stack(state, prefix + "self_attn.o_proj.bias", num_layers, lambda b: b),
            )
    return model


def gpt2_config_from_hf(hf_config: Any, **overrides: Any) -> Gpt2Config:
    """Gpt2Config for a transformers GPT2Config."""
    fields = dict(
        vocab_size=hf_config.vocab_size,
        hidden_size=hf_config.n_embd,
        num_layers=hf_config.n_layer,
        num_heads=hf_config.n_head,
        intermediate_size=hf_config.n_inner,
        max_position=hf_config.n_positions,
        layer_norm_eps=hf_config.layer_norm_epsilon,
        activation=hf_config.activation_function,
    )
    fields.update(overrides)
    return Gpt2Config(**fields)


def load_gpt2(model: Gpt2, hf_model: Any) -> Gpt2:
    """Copy a transformers ``GPT2LMHeadModel`` into ``model`` (Conv1D weights are stored ``[in, out]``)."""
    config = model.config
    state = hf_model.state_dict()
    num_layers, heads, size, embed = config.num_layers, config.num_heads, config.head_size, config.hidden_size
    prefix = "transformer.h.{}."
    layers = lambda m: m.layers.layers

    def qkv_part(index: int, bias: bool) -> Callable[[np.ndarray], np.ndarray]:
        if bias:
            return lambda b: b[index * embed : (index + 1) * embed].reshape(heads, size)
        return lambda w: w[:, index * embed : (index + 1) * embed].reshape(embed, heads, size)

    model = _put(model, lambda m: m.token_embedding.weight, _numpy(state, "transformer.wte.weight"))
    model = _put(model, lambda m: m.position_embedding.weight, _numpy(state, "transformer.wpe.weight"))
    model = _put(model, lambda m: m.ln_f.weight, _numpy(state, "transformer.ln_f.weight"))
    model = _put(model, lambda m: m.ln_f.bias, _numpy(state, "transformer.ln_f.bias"))
    entries: list[tuple[Callable[[Any], NamedArray], str, Callable[[np.ndarray], np.ndarray]]] = [
        (lambda m: layers(m).ln_1.weight, "ln_1.weight", lambda w: w),
        (lambda m: layers(m).ln_1.bias, "ln_1.bias", lambda w: w),
        (lambda m: layers(m).ln_2.weight, "ln_2.weight", lambda w: w),
        (lambda m: layers(m).ln_2.bias, "ln_2.bias", lambda w: w),
        (
            lambda m: layers(m).attention.o_proj.weight,
            "attn.c_proj.weight",
            lambda w: w.reshape(heads, size, embed),
        ),
        (lambda m: layers(m).attention.o_proj.bias, "attn.c_proj.bias", lambda w: w),
        (lambda m: layers(m).mlp.up.weight, "mlp.c_fc.weight", lambda w: w),
        (lambda m: layers(m).mlp.up.bias, "mlp.c_fc.bias", lambda w: w),
        (lambda m: layers(m).mlp.down.weight, "mlp.c_proj.weight", lambda w: w),
        (lambda m: layers(m).mlp.down.bias, "mlp.c_proj.bias", lambda w: w),
    ]
    for index, name in enumerate(("q_proj", "k_proj", "v_proj")):
        entries.append(
            (
                lambda m, n=name: getattr(layers(m).attention, n).weight,
                "attn.c_attn.weight",
                qkv_part(index, False),
            )
        )
        entries.append(
            (
                lambda m, n=name: getattr(layers(m).attention, n).bias,
                "attn.c_attn.bias",
                qkv_part(index, True),
            )
        )
    for ours, theirs, transform in entries:
        model = _put(model, ours, _stack(state, prefix + theirs, num_layers, transform))
    return model
