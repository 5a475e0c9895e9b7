"""Model configurations: the `ModelConfig` base and the registry of families by name.

A family is a frozen dataclass registered with ``@register_model("llama")``; ``model_config("llama",
num_layers=2)`` builds one with overrides, and ``config.init(key)`` (or `init_model`) builds the model.
"""

from __future__ import annotations

import abc
import dataclasses
import difflib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import jax
import jax.numpy as jnp

from halyard.models.attention.context_parallel import CONTEXT_PARALLEL
from halyard.models.attention.splash import SplashBlockSizes
from halyard.named.nn import REMAT_POLICIES

if TYPE_CHECKING:
    from halyard.models.model import CausalLM

ATTENTION_IMPLEMENTATIONS = ("auto", "reference", "xla", "blocked", "cudnn", "splash")


@dataclasses.dataclass(frozen=True)
class ModelConfig(abc.ABC):
    """Fields every family shares: the performance knobs and the dtype policy.

    Attributes:
        attention_implementation: ``auto`` | ``reference`` | ``xla`` | ``blocked`` | ``cudnn`` |
            ``splash`` (Pallas, TPU; ``auto`` picks it there for training); changes numerics only within
            float tolerance and never the parameter tree.
        context_parallel: ``auto`` | ``ring`` | ``all_gather`` | ``ulysses``: how attention runs when the
            mesh splits the sequence (``trainer.mesh.sequence`` > 1): K/V passed around a ring, K/V
            all-gathered, or an all-to-all to heads (``auto``: ``ulysses`` where each device's heads and
            KV heads divide by the split, else ``all_gather``); numerics within float tolerance.
        pipeline_microbatches: when the mesh has a ``stage`` axis of size ``S`` > 1 (``trainer.mesh.stage``), the
            layer stack runs as a pipeline over it (`halyard.models.decoder.pipeline`): each batch is cut
            into this many microbatches (at least ``S``; more shrink the bubble ``(S-1)/(R M + S-1)``).
        pipeline_repeats: ``R``, the pieces of the layer stack each stage holds (circular when above 1):
            ``num_layers`` must divide by ``S * R``.
        scan_layers: run the layers under a scan over the ``layers`` axis (compile time independent of
            depth); ``False`` unrolls them (same parameters, same results).
        remat: what the backward pass recomputes per layer: ``none``, ``full``, ``save_dots`` (keep
            matmul outputs, recompute norms, activations and attention), ``nested`` (sqrt(L) checkpoints),
            ``offload`` (matmul outputs to host) or ``save_attention`` (keep only the attention kernel's
            inputs and output, recompute the rest). Default ``save_dots``: less activation memory, and
            on CPU also faster than ``none`` (fewer fresh pages to fill outweigh the recomputation; figures
            in benchmarks/README.md). Mixtral defaults to ``none``.
        param_dtype: dtype the parameters are created in.
        compute_dtype: dtype activations are computed in (``None``: the parameters' dtype); weights are
            cast to it on use, the loss is always computed in float32.
        optimizer_dtype: dtype of the optimizer's state and arithmetic (``None``: the parameters' dtype);
            ``param_dtype: bfloat16`` with ``optimizer_dtype: float32`` keeps the weights (and gradients)
            in bfloat16 and Adam's moments in float32, each update rounded once into the weights.
        loss_block_size: vocabulary block of the cross-entropy (``None``: full logits at once), used when
            the float32 logits of a batch would take more than ``loss_full_logits_max_mib``.
        loss_full_logits_max_mib: up to this many MiB of float32 ``[tokens, vocab]`` logits the loss is
            computed on the full logits (faster: the blocked backward recomputes the logits; figures in
            benchmarks/README.md); 0 always uses blocks.
        attention_block_size: queries and keys per block of the ``blocked`` attention kernel (the CPU
            default); ``None``: 64 on CPU, 128 elsewhere (see `halyard.models.attention.default_block_size`).
            A sequence no longer than one block runs as a single block.
        splash_block_sizes: the tiles of the ``splash`` kernel (``query``, ``key``, ``key_compute``,
            ``backward_query``, ``backward_key``, ``fused_backward``; `SplashBlockSizes`).
        eos_token_ids: the ids that end a sequence (a Hugging Face checkpoint's ``eos_token_id``, all of
            a list such as Llama 3.1 Instruct's): `halyard.serve`'s engine stops at them unless a request says
            otherwise, and `export_hf` writes them back. Empty: none known.
    """

    family: ClassVar[str] = ""

    attention_implementation: str = "auto"
    context_parallel: str = "auto"
    pipeline_microbatches: int = 1
    pipeline_repeats: int = 1
    scan_layers: bool = True
    remat: str = "save_dots"
    param_dtype: str = "float32"
    compute_dtype: str | None = None
    optimizer_dtype: str | None = None
    loss_block_size: int | None = 2048
    loss_full_logits_max_mib: int = 512
    attention_block_size: int | None = None
    splash_block_sizes: SplashBlockSizes = dataclasses.field(default_factory=SplashBlockSizes)
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        ids = self.eos_token_ids
        if not isinstance(ids, (tuple, list)) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids
        ):
            raise ValueError(f"{type(self).__name__}.eos_token_ids must be a list of token ids, got {ids!r}")
        object.__setattr__(self, "eos_token_ids", tuple(ids))  # a YAML list: hashable like the rest
        _check_choice(self, "attention_implementation", ATTENTION_IMPLEMENTATIONS)
        _check_choice(self, "context_parallel", CONTEXT_PARALLEL)
        _check_choice(self, "remat", REMAT_POLICIES)
        for name in ("pipeline_microbatches", "pipeline_repeats"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{type(self).__name__}.{name} must be a positive int, got {value!r}")
        if not isinstance(self.loss_full_logits_max_mib, int) or self.loss_full_logits_max_mib < 0:
            raise ValueError(
                f"{type(self).__name__}.loss_full_logits_max_mib must be a non-negative int, "
                f"got {self.loss_full_logits_max_mib!r}"
            )
        block = self.attention_block_size
        if block is not None and (isinstance(block, bool) or not isinstance(block, int)):
            raise ValueError(
                f"{type(self).__name__}.attention_block_size must be an int or None, got {block!r}"
            )
        if block is not None and block < 1:
            raise ValueError(f"{type(self).__name__}.attention_block_size must be positive, got {block}")
        for name in ("param_dtype", "compute_dtype", "optimizer_dtype"):
            value = getattr(self, name)
            if value is not None:
                try:
                    jnp.dtype(value)
                except TypeError as error:
                    raise ValueError(f"{type(self).__name__}.{name}={value!r} is not a dtype name") from error

    @abc.abstractmethod
    def init(self, key: jax.Array) -> CausalLM:
        """Build the model with freshly initialised parameters.

        Args:
            key: PRNG key; the same key gives the same parameters.
        """

    @abc.abstractmethod
    def num_params(self) -> int:
        """Number of parameters of the model this config builds (tied weights counted once)."""

    @abc.abstractmethod
    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs (forward + backward) per token at ``seq_len``; see `halyard.models.flops`."""

    # The family registry as a tagged union: ``type: llama`` picks `LlamaConfig`. These four classmethods are
    # the choice protocol config libraries read (draccus's `ChoiceType`), so a run config can declare a field
    # of type `ModelConfig` and decode any registered family into it, with no config library imported here.
    @classmethod
    def get_choice_class(cls, name: str) -> type[ModelConfig]:
        """The config class registered as ``name`` (`config_class`)."""
        return config_class(name)

    @classmethod
    def get_known_choices(cls) -> dict[str, type[ModelConfig]]:
        """Every registered family by name."""
        return {name: config_class(name) for name in registered_models()}

    @classmethod
    def get_choice_name(cls, subcls: type) -> str:
        """The name ``subcls`` is registered under.

        Raises:
            ValueError: ``subcls`` is not a registered family (a base class such as `ModelConfig`).
        """
        for name in registered_models():
            if config_class(name) is subcls:
                return name
        raise ValueError(f"{subcls.__name__} is not a registered model family")

    @classmethod
    def default_choice_name(cls) -> str | None:
        """No family is the default: ``type:`` is required."""
        return None

    def replace(self, **overrides: Any) -> ModelConfig:
        """A copy with ``overrides`` applied; an unknown field is an error with a suggestion."""
        _check_fields(type(self), overrides)
        return dataclasses.replace(self, **overrides)

    @property
    def compute(self) -> Any:
        """The activation dtype as a numpy dtype."""
        return jnp.dtype(self.compute_dtype or self.param_dtype)

    @property
    def params(self) -> Any:
        """The parameter dtype as a numpy dtype."""
        return jnp.dtype(self.param_dtype)

    @property
    def optimizer(self) -> Any:
        """The optimizer state's dtype as a numpy dtype."""
        return jnp.dtype(self.optimizer_dtype or self.param_dtype)


def _check_choice(config: Any, field: str, choices: tuple[str, ...]) -> None:
    value = getattr(config, field)
    if value not in choices:
        raise ValueError(f"{type(config).__name__}.{field}={value!r}; choose one of {', '.join(choices)}")


def _check_fields(cls: type, overrides: dict[str, Any]) -> None:
    names = [f.name for f in dataclasses.fields(cls)]
    for key in overrides:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; fields are {', '.join(names)}"
            raise TypeError(f"{cls.__name__} has no field {key!r}{hint}")


_REGISTRY: dict[str, type[ModelConfig]] = {}

C = TypeVar("C", bound=type[ModelConfig])


def register_model(name: str) -> Callable[[C], C]:
    """Class decorator registering a config class under ``name`` (``@register_model("llama")``).

    Raises:
        ValueError: ``name`` is already registered to another class.
    """

    def decorate(cls: C) -> C:
        existing = _REGISTRY.get(name)
        if existing is not None and existing is not cls:
            raise ValueError(f"Model family {name!r} is already registered to {existing.__name__}")
        _REGISTRY[name] = cls
        cls.family = name
        return cls

    return decorate


def registered_models() -> tuple[str, ...]:
    """Names of the registered model families, sorted."""
    return tuple(sorted(_REGISTRY))


def config_class(name: str) -> type[ModelConfig]:
    """The config class registered as ``name``.

    Raises:
        KeyError: no such family (the message lists the known ones and the closest name).
    """
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise KeyError(f"Unknown model family {name!r}; known: {', '.join(registered_models())}.{hint}")
    return _REGISTRY[name]


def model_config(name: str, **overrides: Any) -> ModelConfig:
    """The config of family ``name`` with its defaults replaced by ``overrides``.

    Args:
        name: a registered family (`registered_models`), e.g. ``"llama"``.
        overrides: field values, e.g. ``num_layers=2, hidden_size=64``.

    Raises:
        KeyError: unknown family.
        TypeError: unknown field (with a suggestion).
        ValueError: an inconsistent value (the family's checks name the field).
    """
    cls = config_class(name)
    _check_fields(cls, overrides)
    return cls(**overrides)
