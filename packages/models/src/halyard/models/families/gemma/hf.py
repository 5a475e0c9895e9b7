"""Gemma, Gemma 2 and Gemma 3 (text) as Hugging Face checkpoints: ``GemmaForCausalLM``,
``Gemma2ForCausalLM`` and ``Gemma3ForCausalLM`` (model_type ``gemma3_text``).

The tensors are laid out as Llama's (`llama_hf.mappings`, from each variant's layout: Gemma 2's four norms,
Gemma 3's per-head q/k norms). The norms' weights are stored as Hugging Face stores them (``scale - 1``:
both apply ``1 + weight``), so they copy as they are; projections transpose (``nn.Linear`` keeps
``[out, in]``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from halyard.models.families.gemma.config import Gemma2Config, Gemma3Config, GemmaConfig
from halyard.models.families.llama import hf as llama_hf
from halyard.models.hf import COMMON_RULE, HfFamily, KeyRule, UnsupportedModelError, names, register_hf
from halyard.models.hf.readers import FULL, SLIDING, renamed, rope
from halyard.models.hf.spec import Reader
from halyard.models.hf.writers import refusal, rope_keys
from halyard.models.rotary import RotaryConfig

# From the keys transformers' GemmaConfig / Gemma2Config / Gemma3TextConfig and modeling_gemma*.py read.
_COMMON = COMMON_RULE + KeyRule(
    implemented=names(
        "vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads",
        "num_key_value_heads head_dim max_position_embeddings rms_norm_eps initializer_range",
        "tie_word_embeddings rope_parameters rope_scaling rope_theta attention_bias",
        # not read by Gemma, whose rope rotates whole heads: a factor other than 1 is refused
        "partial_rotary_factor",
    ),
    fixed={"use_bidirectional_attention": (None, False)},  # bidirectional attention over every token
)
GEMMA_RULE = _COMMON + KeyRule(
    implemented=names("hidden_act hidden_activation"),
    # read by the shared mask builders; Gemma attends to every earlier position
    fixed={"sliding_window": (None,), "layer_types": (None,)},
)
GEMMA2_RULE = _COMMON + KeyRule(
    implemented=names(
        "hidden_activation query_pre_attn_scalar attn_logit_softcapping final_logit_softcapping",
        "sliding_window layer_types",
    ),
    no_effect=names(
        "cache_implementation",  # generate's cache class (Gemma 2's "hybrid")
        "hidden_act",  # kept by transformers 4.x's Gemma2Config, but its MLP reads hidden_activation
    ),
)
GEMMA3_RULE = GEMMA2_RULE + KeyRule(
    implemented=names("rope_local_base_freq sliding_window_pattern"),
    no_effect=names(
        # transformers 5 writes it beside layer_types, which decides
        "_sliding_window_pattern",
        # read only by the multimodal Gemma3ForConditionalGeneration (model_type gemma3) in the same module
        "image_token_id mm_tokens_per_image text_config vision_config",
    ),
)

ARCHITECTURES = {"gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM"}
REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")

# transformers' defaults for keys a config.json may omit (its config classes' field defaults).
GEMMA_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": 16,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "max_position_embeddings": 8192,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "rope_theta": 10000.0,
    "attention_bias": False,
}
GEMMA2_DEFAULTS: dict[str, Any] = {
    **{key: value for key, value in GEMMA_DEFAULTS.items() if key != "hidden_act"},
    "num_key_value_heads": 4,
    "hidden_activation": "gelu_pytorch_tanh",
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "final_logit_softcapping": 30.0,
    "attn_logit_softcapping": 50.0,
}
GEMMA3_DEFAULTS: dict[str, Any] = {
    **GEMMA2_DEFAULTS,
    "max_position_embeddings": 131072,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
    "sliding_window_pattern": 6,
}

_SHAPE_FIELDS = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads",
    "num_key_value_heads": "num_kv_heads",
    "head_dim": "head_dim",
    "max_position_embeddings": "max_position",
    "rms_norm_eps": "rms_norm_eps",
    "initializer_range": "initializer_range",
}


def layer_type(layer: int, pattern: int) -> str:
    """transformers' Gemma rule: every ``pattern``-th layer (1-based) is global, the others local."""
    return FULL if (layer + 1) % pattern == 0 else SLIDING


def _pattern(hf: Mapping[str, Any], used: set[str], default: int) -> int:
    """``sliding_window_pattern`` from ``layer_types`` (every pattern-th layer global), else ``default``."""
    used.add("layer_types")
    num_layers = int(hf["num_hidden_layers"])
    types = hf.get("layer_types")
    if types is None:
        return default
    types = list(types)
    for pattern in range(1, num_layers + 2):
        if types == [layer_type(layer, pattern) for layer in range(num_layers)]:
            return pattern
    raise UnsupportedModelError(
        f"layer_types {types} (num_hidden_layers={num_layers}): Halyard's Gemma makes every n-th layer "
        f"{FULL!r} and the others {SLIDING!r} (sliding_window_pattern n)"
    )


def _gemma3_ropes(hf: Mapping[str, Any], used: set[str]) -> tuple[RotaryConfig, RotaryConfig]:
    """``(global rope, local rope)`` by transformers' Gemma3TextConfig rule: ``rope_parameters`` per layer
    type, with ``rope_scaling`` merged into the global one; ``rope_theta`` and ``rope_local_base_freq``
    where those dicts name no theta."""
    used.update({"rope_parameters", "rope_scaling", "rope_theta", "rope_local_base_freq"})
    parameters = hf.get("rope_parameters") or {}
    unknown = sorted(set(parameters) - {FULL, SLIDING})
    if unknown:
        raise UnsupportedModelError(
            f"rope_parameters has key(s) {unknown}; Gemma 3 keeps one dict per layer type ({FULL!r}, {SLIDING!r})"
        )
    ropes = []
    for kind, theta_key, extra in (
        (FULL, "rope_theta", hf.get("rope_scaling")),
        (SLIDING, "rope_local_base_freq", None),
    ):
        values = {"rope_type": "default", **(parameters.get(kind) or {}), **(extra or {})}
        values.setdefault("rope_theta", hf[theta_key])
        result = RotaryConfig.from_hf(values["rope_theta"], values)
        if result.partial_rotary_factor != 1.0:
            raise UnsupportedModelError(
                f"rope_parameters[{kind!r}] has partial_rotary_factor={result.partial_rotary_factor}: Gemma 3 "
                "rotates the whole head"
            )
        ropes.append(result)
    return ropes[0], ropes[1]


def _shape(hf: Mapping[str, Any], used: set[str]) -> dict[str, Any]:
    """The fields every Gemma reads alike."""
    fields = renamed(hf, used, _SHAPE_FIELDS)
    used.update({"tie_word_embeddings", "attention_bias"})
    fields.update(tie_embeddings=bool(hf["tie_word_embeddings"]), attention_bias=bool(hf["attention_bias"]))
    return fields


def _read_gemma(hf: Mapping[str, Any], used: set[str]) -> dict[str, Any]:
    fields = {**_shape(hf, used), "rope": rope(hf, used)}
    # transformers 4.39-4.5x read hidden_activation first; every release reads Gemma's legacy hidden_act
    # "gelu" as the tanh approximation the checkpoints were trained with.
    used.update({"hidden_act", "hidden_activation"})
    activation = hf.get("hidden_activation") or hf["hidden_act"]
    fields["activation"] = "gelu_pytorch_tanh" if activation == "gelu" else activation
    return fields


def _windowed(hf: Mapping[str, Any], used: set[str], default_pattern: int) -> dict[str, Any]:
    """Gemma 2's and Gemma 3's fields but the rotary ones."""
    fields = _shape(hf, used)
    fields.update(
        renamed(
            hf, used, {"hidden_activation": "activation", "query_pre_attn_scalar": "query_pre_attn_scalar"}
        )
    )
    used.update({"attn_logit_softcapping", "final_logit_softcapping", "sliding_window"})
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        fields[key] = None if hf[key] is None else float(hf[key])
    fields["sliding_window"] = None if hf["sliding_window"] is None else int(hf["sliding_window"])
    fields["sliding_window_pattern"] = _pattern(hf, used, default_pattern)
    return fields


def _read_gemma2(hf: Mapping[str, Any], used: set[str]) -> dict[str, Any]:
    return {**_windowed(hf, used, 2), "rope": rope(hf, used)}


def _read_gemma3(hf: Mapping[str, Any], used: set[str]) -> dict[str, Any]:
    used.add("sliding_window_pattern")  # what transformers 4.x reads; a layer_types list wins
    fields = _windowed(hf, used, int(hf["sliding_window_pattern"]))
    fields["rope"], fields["local_rope"] = _gemma3_ropes(hf, used)
    return fields


def _write_gemma(config: GemmaConfig) -> dict[str, Any]:
    architecture = ARCHITECTURES[config.family]
    values: dict[str, Any] = {theirs: getattr(config, ours) for theirs, ours in _SHAPE_FIELDS.items()}
    values.update(
        hidden_activation=config.activation,
        tie_word_embeddings=config.tie_embeddings,
        attention_bias=config.attention_bias,
        attention_dropout=0.0,
        **rope_keys(config.rope, architecture, config),
    )
    if not isinstance(config, Gemma2Config):
        if config.activation == "gelu":
            fix = "transformers reads Gemma's hidden_act 'gelu' as 'gelu_pytorch_tanh'"
            raise refusal(config, architecture, "activation='gelu'", fix)
        return {**values, "hidden_act": config.activation}
    values.update(
        query_pre_attn_scalar=config.query_pre_attn_scalar,
        attn_logit_softcapping=config.attn_logit_softcapping,
        final_logit_softcapping=config.final_logit_softcapping,
        sliding_window=config.sliding_window,
        layer_types=[layer_type(layer, config.sliding_window_pattern) for layer in range(config.num_layers)],
    )
    if isinstance(config, Gemma3Config):
        local = rope_keys(config.local_rope, architecture, config)
        if local["rope_scaling"] is not None:
            raise refusal(
                config, architecture, f"local_rope.scaling={config.local_rope.scaling!r}", "use 'default'"
            )
        values.update(
            rope_local_base_freq=local["rope_theta"], sliding_window_pattern=config.sliding_window_pattern
        )
    return values


def _spec(family: str, model_type: str, rule: KeyRule, defaults: Mapping[str, Any], read: Reader) -> HfFamily:
    return register_hf(
        HfFamily(
            family=family,
            model_type=model_type,
            architecture=ARCHITECTURES[family],
            rule=rule,
            required=REQUIRED,
            defaults=defaults,
            read=read,
            write=_write_gemma,
            mappings=llama_hf.mappings,  # the tensors are Llama's, named by each variant's layout
        )
    )


GEMMA = _spec("gemma", "gemma", GEMMA_RULE, GEMMA_DEFAULTS, _read_gemma)
GEMMA2 = _spec("gemma2", "gemma2", GEMMA2_RULE, GEMMA2_DEFAULTS, _read_gemma2)
GEMMA3 = _spec("gemma3", "gemma3_text", GEMMA3_RULE, GEMMA3_DEFAULTS, _read_gemma3)
