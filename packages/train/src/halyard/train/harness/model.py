"""`HalyardLM`: a Halyard `CausalLM` behind lm-evaluation-harness's model interface, registered as ``halyard``.

    lm = HalyardLM.from_run("runs/demo")                      # the latest checkpoint, on the run's mesh
    lm = HalyardLM(model, "tokenizer.json", batch_size=16)   # a model in memory
    lm_eval.simple_evaluate(model=lm, tasks=["hellaswag"])
    lm_eval.simple_evaluate(model="halyard", model_args="run=runs/demo,batch_size=16", tasks=[...])

Requests are tokenized as lm-eval's Hugging Face model (`HFLM`) tokenizes them (`TemplateLM`: trailing
context spaces move to the continuation, an empty context becomes the BOS token, or EOS without one), and
scored and continued in a few bucketed shapes (see `scoring` and `generation`), so the results match
``hf`` on the exported folder.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from halyard.export import read_tokenizer
from halyard.models import CausalLM, num_params
from halyard.serve import SamplingParams
from halyard.shard import Layout, process_count
from halyard.train.data_assembly.tokenizer import load_run_tokenizer
from halyard.train.harness.generation import PromptContinuer
from halyard.train.harness.scoring import Window, WindowScorer
from halyard.train.run.loading import load_hf_model, load_run_model

DEFAULT_MAX_LENGTH = 2048
"""The context of a model whose config names no ``max_position`` (HFLM's default too)."""
DEFAULT_MAX_GEN_TOKS = 256
"""Tokens generated when a task's ``generation_kwargs`` name no ``max_gen_toks`` (HFLM's default too)."""
SAMPLING_KWARGS = ("do_sample", "temperature", "top_k", "top_p")
"""The ``generation_kwargs`` a task may give besides ``until`` and ``max_gen_toks``."""


@register_model("halyard")
class HalyardLM(TemplateLM):  # type: ignore[misc]
    """lm-eval's `LM` for a Halyard model: ``loglikelihood``, ``loglikelihood_rolling``, ``generate_until``.

    Args:
        model: any `CausalLM` (sharded or not).
        tokenizer: the model's tokenizer: a ``tokenizer.json`` or a folder with one (and perhaps
            ``tokenizer_config.json`` naming BOS/EOS), loaded as training loads it.
        batch_size: requests per forward pass (and prompts per generation batch).
        max_length: the longest input in tokens; longer requests lose tokens on the left, as in HFLM.
            Default: the model config's ``max_position``, else 2048.
        vocab_size: ids the softmax runs over; logits past it (vocabulary padding) are dropped. Default:
            the tokenizer's vocabulary when it is smaller than the model's (what ``halyard export`` writes),
            else the model's.
        mesh, layout: place the parameters and every batch as training does (both or neither).
        seed: PRNG seed of sampled generation (tasks with ``do_sample: true``).
        source: what the model is, for the results' ``config`` (a run folder, an HF folder).
        step: the checkpoint step, for the results.

    Raises:
        ValueError: a bad size, mesh without layout, a tokenizer without an EOS token, several processes.
        TokenizerNotFoundError: no tokenizer at ``tokenizer``.
    """

    def __init__(
        self,
        model: CausalLM,
        tokenizer: str | Path,
        *,
        batch_size: int = 8,
        max_length: int | None = None,
        vocab_size: int | None = None,
        mesh: jax.sharding.Mesh | None = None,
        layout: Layout | None = None,
        seed: int = 0,
        source: str | None = None,
        step: int | None = None,
    ) -> None:
        super().__init__()
        if (mesh is None) != (layout is None):
            raise ValueError("HalyardLM takes a mesh and a layout together (or neither)")
        if process_count() > 1:
            raise ValueError("HalyardLM evaluates in one process; run `halyard eval` on a single host")
        batch_size = int(batch_size)
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        config = model.model_config
        self.max_length = int(max_length or getattr(config, "max_position", None) or DEFAULT_MAX_LENGTH)
        limit = model.position_limit
        if self.max_length < 2 or (limit is not None and self.max_length > limit):
            raise ValueError(
                f"max_length={self.max_length} must lie in 2..{limit or 'any'} (the model's positions)"
            )
        self.tokenizer = load_run_tokenizer(str(tokenizer))
        info = read_tokenizer(tokenizer)
        eos = info.special_id("eos")
        eos = eos if eos is not None else next(iter(getattr(config, "eos_token_ids", ())), None)
        if eos is None:
            raise ValueError(
                f"the tokenizer {tokenizer} names no EOS token (tokenizer_config.json eos_token) and the model "
                "config has no eos_token_ids; lm-eval needs one to end generations and start empty contexts"
            )
        bos = info.special_id("bos")
        self._eos = int(eos)
        self._prefix = int(bos) if bos is not None else self._eos
        self._bos_text = None if bos is None else self.tokenizer.decode([bos], skip_special_tokens=False)
        self._prefix_text = self.tokenizer.decode([self._prefix], skip_special_tokens=False)
        self._stop_tokens = tuple(dict.fromkeys((self._eos, *getattr(config, "eos_token_ids", ()))))
        if vocab_size is None:
            vocab_size = min(config.vocab_size, info.vocab_size)
        if not 0 < vocab_size <= config.vocab_size:
            raise ValueError(f"vocab_size={vocab_size} must lie in 1..{config.vocab_size} (the model's)")
        if mesh is not None and layout is not None:
            model = jax.device_put(model, layout.shardings(model, mesh))
        self.model = model
        self.batch_size = batch_size
        self.seed = seed
        self.source = source
        self.step = step
        self._score = WindowScorer(model, vocab_size, self.max_length, batch_size, mesh, layout)
        self._continue = PromptContinuer(model, batch_size, self.max_length, mesh, layout)

    def set_model(self, model: CausalLM, *, step: int | None = None) -> None:
        """Evaluate ``model`` from now on: weights of the current model's structure and shapes, placed as it
        was (the trainer's weights after another step), so nothing is placed or compiled again.

        Args:
            model: the new weights.
            step: the training step they are from, for the results' ``config``.

        Raises:
            ValueError: ``model``'s pytree structure is not the current model's.
        """
        current: Any = jax.tree.structure(self.model)
        if jax.tree.structure(model) != current:
            raise ValueError(
                "set_model takes weights of the current model's structure (another model: a new HalyardLM)"
            )
        self.model = model
        self._score.model = model
        self._continue.set_model(model)
        self.step = step

    # -- construction from lm-eval's model_args ------------------------------------------------
    @classmethod
    def from_run(cls, run_dir: str | Path, step: int | None = None, **options: Any) -> HalyardLM:
        """The checkpoint of a training run (``step``, default the latest) on the run's mesh and layout,
        with the run's tokenizer; ``options`` as for the constructor.

        Raises:
            ConfigError: ``run_dir`` is not a run folder, has no complete checkpoint, or no such step.
        """
        loaded = load_run_model(run_dir, step)
        return cls(
            loaded.model,
            loaded.tokenizer,
            mesh=loaded.mesh,
            layout=loaded.layout,
            source=str(run_dir),
            step=loaded.step,
            **options,
        )

    @classmethod
    def from_hf(cls, folder: str | Path, **options: Any) -> HalyardLM:
        """A Hugging Face folder (config.json, safetensors, tokenizer.json) on one device; the softmax runs
        over the checkpoint's vocabulary, as transformers' does. ``options`` as for the constructor.

        Raises:
            HfConversionError: the folder is not a supported checkpoint.
        """
        loaded = load_hf_model(folder)
        options.setdefault("vocab_size", loaded.vocab_size)
        return cls(loaded.model, loaded.tokenizer, source=str(folder), **options)

    @classmethod
    def create_from_arg_obj(
        cls, arg_dict: Mapping[str, Any], additional_config: Mapping[str, Any] | None = None
    ) -> HalyardLM:
        """lm-eval's constructor: ``run=FOLDER[,step=N]`` or ``hf=FOLDER``, or ``model=`` and ``tokenizer=``,
        plus the constructor's options. ``device`` and ``max_batch_size`` are ignored (JAX places arrays on
        its own devices; the batch size is fixed).

        Raises:
            ValueError: none or several of ``run``, ``hf``, ``model``.
        """
        options = dict(arg_dict)
        options.update({k: v for k, v in (additional_config or {}).items() if v is not None})
        options.pop("device", None)
        options.pop("max_batch_size", None)
        for key in ("batch_size", "max_length", "vocab_size", "seed", "step"):
            value = options.get(key)
            if isinstance(value, str):
                if not value.strip().isdigit():
                    raise ValueError(
                        f"model_args {key}={value!r}: give a whole number (no 'auto' sizes here)"
                    )
                options[key] = int(value)
        sources = [key for key in ("run", "hf", "model") if key in options]
        if len(sources) != 1:
            raise ValueError(
                "model_args for halyard need exactly one of run=RUN_DIR, hf=FOLDER or model= (a CausalLM, with "
                f"tokenizer=), got {sources or 'none'}"
            )
        if "run" in options:
            return cls.from_run(options.pop("run"), **options)
        if "hf" in options:
            return cls.from_hf(options.pop("hf"), **options)
        return cls(options.pop("model"), options.pop("tokenizer"), **options)

    @classmethod
    def create_from_arg_string(
        cls, arg_string: str, additional_config: Mapping[str, Any] | None = None
    ) -> HalyardLM:
        """``create_from_arg_obj`` of ``"key=value,key=value"``."""
        pairs = [item.split("=", 1) for item in arg_string.split(",") if item.strip()]
        bad = [item for item in pairs if len(item) != 2]
        if bad:
            raise ValueError(f"model_args {arg_string!r}: write key=value pairs separated by commas")
        return cls.create_from_arg_obj({k.strip(): v.strip() for k, v in pairs}, additional_config)

    # -- TemplateLM's hooks ----------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        """The EOS id: it ends generations and is the default stop string."""
        return self._eos

    @property
    def prefix_token_id(self) -> int:
        """What an empty context becomes: BOS, or EOS when the tokenizer has no BOS (as in HFLM)."""
        return self._prefix

    def tok_encode(
        self,
        string: str,
        add_special_tokens: bool | None = None,
        left_truncate_len: int | None = None,
        **_: Any,
    ) -> list[int]:
        """Token ids of ``string``; special tokens (the tokenizer's post-processor) are added unless asked
        otherwise or ``string`` already starts with the prefix token."""
        if add_special_tokens is None:
            add_special_tokens = not string.startswith(self._prefix_text)
        ids: list[int] = self.tokenizer.encode(string, add_special_tokens=add_special_tokens).ids
        return ids[-left_truncate_len:] if left_truncate_len else ids

    def _loglikelihood_tokens(
        self, requests: list[tuple[Any, list[int], list[int]]], disable_tqdm: bool = False, **_: Any
    ) -> list[tuple[float, bool]]:
        windows = []
        for _request, context, continuation in requests:
            if len(continuation) > self.max_length:
                raise ValueError(
                    f"a continuation of {len(continuation)} tokens is longer than max_length={self.max_length}"
                )
            windows.append(Window((context + continuation)[-(self.max_length + 1) :], len(continuation)))
        results = self._score(windows)
        for (request, _context, _continuation), result in zip(requests, results, strict=True):
            if request is not None:
                self.cache_hook.add_partial("loglikelihood", request, result)
        return results

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """The log-likelihood of each whole string, in windows of ``max_length`` that predict every token
        once (the first after the prefix token), as lm-eval's other models do."""
        windows, owners = [], []
        for index, request in enumerate(requests):
            (string,) = request.args
            tokens = self.tok_encode(string)
            for context, predicted in map(
                make_disjoint_window, get_rolling_token_windows(tokens, self._prefix, self.max_length, 1)
            ):
                windows.append(Window(context + predicted, len(predicted)))
                owners.append(index)
        totals = [0.0] * len(requests)
        for owner, (log_probability, _) in zip(owners, self._score(windows), strict=True):
            totals[owner] += log_probability
        for request, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Continue each context (greedy unless the task samples) until a stop string or EOS, or for
        ``max_gen_toks`` tokens; the text before the first stop string."""
        results: list[str] = [""] * len(requests)
        groups: dict[str, list[int]] = {}
        for index, request in enumerate(requests):
            groups.setdefault(repr(sorted(request.args[1].items())), []).append(index)
        for indices in groups.values():
            contexts = [requests[i].args[0] for i in indices]
            texts = self._generate(contexts, requests[indices[0]].args[1])
            for index, context, text in zip(indices, contexts, texts, strict=True):
                results[index] = text
                self.cache_hook.add_partial("generate_until", (context, requests[index].args[1]), text)
        return results

    def _generate(self, contexts: list[str], gen_kwargs: Mapping[str, Any]) -> list[str]:
        kwargs = normalize_gen_kwargs(dict(gen_kwargs), DEFAULT_MAX_GEN_TOKS)
        eos_text = self.tokenizer.decode([self._eos], skip_special_tokens=False)
        until = handle_stop_sequences(kwargs.pop("until", None), eos=eos_text)
        max_new_tokens = int(kwargs.pop("max_gen_toks"))
        unknown = sorted(set(kwargs) - set(SAMPLING_KWARGS))
        if unknown:
            raise ValueError(
                f"generation_kwargs {unknown} are not supported by the halyard model (it takes until, "
                f"max_gen_toks and {', '.join(SAMPLING_KWARGS)})"
            )
        max_prompt = self.max_length - max_new_tokens
        if max_prompt < 1:
            raise ValueError(
                f"max_gen_toks={max_new_tokens} leaves no room for a prompt in max_length={self.max_length}"
            )
        sampled = bool(kwargs.get("do_sample")) and float(kwargs.get("temperature", 0.0)) > 0
        sampling = SamplingParams(
            max_tokens=max_new_tokens,
            temperature=float(kwargs["temperature"]) if sampled else 0.0,
            top_k=int(kwargs.get("top_k") or 0) if sampled else 0,
            top_p=float(kwargs.get("top_p") or 1.0) if sampled else 1.0,
            stop_token_ids=self._stop_tokens,
        )
        prompts = [self._encode_prompt(context)[-max_prompt:] or [self._prefix] for context in contexts]
        generated = self._continue(prompts, sampling, self.seed)
        return [
            postprocess_generated_text(self.tokenizer.decode(ids, skip_special_tokens=True), until, None)
            for ids in generated
        ]

    def _encode_prompt(self, context: str) -> list[int]:
        # HFLM's batch encoding adds special tokens unless the context starts with the BOS token itself.
        starts_with_bos = self._bos_text is not None and context.startswith(self._bos_text)
        return self.tok_encode(context, add_special_tokens=not starts_with_bos)

    def get_model_info(self) -> dict[str, Any]:
        """What the results' ``config`` records about the model."""
        return {
            "halyard_source": self.source,
            "halyard_step": self.step,
            "model_num_parameters": num_params(self.model.model_config),
            "max_length": self.max_length,
        }
