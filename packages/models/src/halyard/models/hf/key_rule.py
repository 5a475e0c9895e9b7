"""The rule that decides, key by key, whether a ``config.json`` can be imported.

What Halyard must match is what `transformers` computes for the architecture. So each family states, next
to its tensor mapping (each family folder's ``hf.py``), the keys that the architecture's `transformers` config
class and modeling code read, sorted three ways:

- ``implemented``: mapped to a Halyard config field by the family's reader;
- ``fixed``: accepted only with the values listed (the behaviour Halyard implements, e.g.
  ``pretraining_tp: 1``); another value is an `UnsupportedModelError` naming the key and the value;
- ``no_effect``: read, but they cannot change the logits (dropout rates: Halyard trains without dropout;
  output flags, generation defaults, labels of other heads, bookkeeping).

A key in none of the three is not read by `transformers` for that architecture, so it cannot change what the
model computes (``is_llama_config``, ``transformers.js_config``, ``_num_labels``, ``output_past``...): it is
ignored and listed at debug level (logger ``halyard.export``). With ``strict=True`` it is refused instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from halyard.models.hf.errors import UnsupportedModelError


@dataclasses.dataclass(frozen=True)
class KeyRule:
    """How one architecture's ``config.json`` keys are treated (see the module docstring).

    Attributes:
        implemented: keys the family's reader maps to Halyard fields.
        fixed: key -> the values Halyard accepts (it implements only that behaviour).
        no_effect: keys `transformers` reads that do not change the logits; accepted with any value.
        aliases: another spelling -> the implemented key it means (`transformers`' ``attribute_map``).
    """

    implemented: frozenset[str]
    fixed: Mapping[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    no_effect: frozenset[str] = frozenset()
    aliases: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __add__(self, other: KeyRule) -> KeyRule:
        return KeyRule(
            self.implemented | other.implemented,
            {**self.fixed, **other.fixed},
            self.no_effect | other.no_effect,
            {**self.aliases, **other.aliases},
        )

    @property
    def recognised(self) -> frozenset[str]:
        """Every key the rule names (what ``strict=True`` accepts)."""
        return self.implemented | frozenset(self.fixed) | self.no_effect | frozenset(self.aliases)

    def check(self, hf: Mapping[str, Any], *, strict: bool) -> list[str]:
        """Refuse a fixed key with another value (and, under ``strict``, any unrecognised key).

        Returns:
            The ignored keys (not read by `transformers` for this architecture), sorted.

        Raises:
            UnsupportedModelError: the first offending key, with its value and what is accepted.
        """
        for key, allowed in self.fixed.items():
            if key in hf and not any(_same(hf[key], value) for value in allowed):
                shown = " or ".join(repr(value) for value in allowed)
                raise UnsupportedModelError(
                    f"{key}={hf[key]!r} is not supported: Halyard implements only {key}={shown} for this "
                    "architecture, so the checkpoint would compute something else"
                )
        ignored = sorted(key for key in hf if key not in self.recognised)
        if strict and ignored:
            raise UnsupportedModelError(
                f"option(s) {ignored} are not recognised, and strict=True refuses anything unrecognised "
                "(without strict they are ignored: transformers does not read them for this architecture)"
            )
        return ignored


def names(*groups: str) -> frozenset[str]:
    """The key names in ``groups`` (whitespace-separated)."""
    return frozenset(name for group in groups for name in group.split())


def _same(value: Any, allowed: Any) -> bool:
    """Equality that tells ``False`` from ``0`` and ``True`` from ``1`` (JSON keeps them apart)."""
    if isinstance(value, bool) or isinstance(allowed, bool):
        return value is allowed
    return bool(value == allowed)


# Keys every architecture's transformers code reads (PreTrainedConfig, the attention-mask builders,
# from_pretrained) or that older releases wrote into every config.json.
COMMON_RULE = KeyRule(
    implemented=frozenset({"architectures", "model_type", "bos_token_id", "eos_token_id", "pad_token_id"}),
    fixed={
        "is_encoder_decoder": (False,),
        "add_cross_attention": (False,),
        "tie_encoder_decoder": (False,),
        "pruned_heads": ({},),
        "is_causal": (True,),  # the mask builders make attention bidirectional when false
        "attention_chunk_size": (None,),  # chunked attention when set (generate's mask builder)
        "per_layer_config": (None,),  # per-layer overrides of any of these keys
    },
    no_effect=names(
        # bookkeeping and loading
        "transformers_version dtype torch_dtype _name_or_path name_or_path",
        "_attn_implementation attn_implementation use_bfloat16 torchscript",
        "tokenizer_class prefix finetuning_task task_specific_params sep_token_id",
        "decoder_start_token_id is_decoder cross_attention_hidden_size tf_legacy_loss",
        "chunk_size_feed_forward",
        # outputs that do not change the logits
        "use_cache return_dict output_attentions output_hidden_states",
        # labels of classification heads
        "id2label label2id num_labels problem_type",
        # generation defaults (generate's settings, not the model's function)
        "max_length min_length do_sample early_stopping num_beams num_beam_groups",
        "diversity_penalty temperature top_k top_p typical_p repetition_penalty",
        "length_penalty no_repeat_ngram_size encoder_no_repeat_ngram_size bad_words_ids",
        "num_return_sequences output_scores return_dict_in_generate forced_bos_token_id",
        "forced_eos_token_id remove_invalid_values exponential_decay_length_penalty",
        "suppress_tokens begin_suppress_tokens",
        # training-only: Halyard trains without dropout
        "attention_dropout",
    ),
)
