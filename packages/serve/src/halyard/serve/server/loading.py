"""`ServedModel`: a model with its tokenizer, its end-of-sequence ids and the name clients ask for; from a
Hugging Face folder (`load_hf_folder`) or from a model in memory and its tokenizer's files (`served_model`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from halyard.data import TokenizerSpec, load_tokenizer
from halyard.export import read_hf_config
from halyard.export.importer import read_hf_to_host
from halyard.models import CausalLM
from halyard.serve.int8_weights import check_quantization, quantized
from halyard.serve.requests import eos_ids_of
from halyard.serve.server.backend import start_backend
from halyard.serve.server.host_transfer import put_in_groups, transfer_limit
from halyard.serve.server.options import SERVE_DTYPES
from halyard.serve.server.tokenizer import TextTokenizer


@dataclasses.dataclass(frozen=True)
class ServedModel:
    """What a server serves.

    Attributes:
        name: what ``/v1/models`` lists and requests' ``model`` must say.
        model: the model (on one device, or placed for the engine's mesh).
        tokenizer: its tokenizer and chat template.
        eos_token_ids: ids that end a sample: the model config's (config.json and generation_config.json of
            a Hugging Face folder) and the tokenizer's EOS.
        draft: the draft model of ``--speculative draft=MODEL`` (same tokenizer), or None.
        adapters: the names of the LoRA adapters ``model`` serves besides its base (`halyard.serve.adapters`;
            ``model: adapters[i]`` runs adapter ``i + 1``), in order.
    """

    name: str
    model: CausalLM
    tokenizer: TextTokenizer
    eos_token_ids: tuple[int, ...]
    draft: CausalLM | None = None
    adapters: tuple[str, ...] = ()


def served_model(
    model: CausalLM,
    tokenizer: str | Path | TokenizerSpec,
    name: str,
    *,
    chat_template: str | None = None,
) -> ServedModel:
    """``model`` served under ``name``.

    Args:
        model: the model.
        tokenizer: a tokenizer folder (tokenizer.json, tokenizer_config.json with the chat template...), a
            tokenizer.json, or a loaded `halyard.data.TokenizerSpec`.
        name: the served name.
        chat_template: Jinja text replacing the tokenizer's chat template (None: the tokenizer's).

    Raises:
        TokenizerNotFoundError, TokenizerLoadError: no tokenizer there.
    """
    spec = tokenizer if isinstance(tokenizer, TokenizerSpec) else load_tokenizer(str(tokenizer))
    text = TextTokenizer(spec, chat_template)
    return ServedModel(name, model, text, eos_ids_of(model.model_config, text.token_id(spec.eos_token)))


def load_hf_folder(
    folder: str | Path,
    *,
    name: str | None = None,
    chat_template: str | None = None,
    dtype: str = "auto",
    quantization: str = "none",
) -> ServedModel:
    """A Hugging Face folder's model (halyard.export's importer), tokenizer and chat template.

    The weights and the tokenizer are read into host memory while JAX's backend starts in another thread
    (`start_backend`; on a TPU its runtime takes seconds), then the weights are put on the device, in groups
    that fit the TPU runtime's host buffer (`halyard.serve.server.host_transfer`).

    Args:
        folder: holds config.json, the safetensors weights and the tokenizer files.
        name: the served name (default: the folder's name).
        chat_template: Jinja text replacing the tokenizer's chat template.
        dtype: the weights' dtype in memory, one of `SERVE_DTYPES`: ``auto`` keeps the dtype config.json
            says they are stored in (``dtype`` / ``torch_dtype``: a bfloat16 checkpoint is served in
            bfloat16, as vLLM does), float32 when it names no dtype of those.
        quantization: ``int8``: the weights quantized on the device as soon as they are there
            (`halyard.serve.int8_weights.quantized`, what the engine would do), so the full-precision copy
            is freed before the engine starts.

    Raises:
        HfConversionError: a missing config.json or weights, or an unsupported architecture.
        TokenizerNotFoundError: the folder has no tokenizer.json.
        ValueError: ``dtype`` is not one of `SERVE_DTYPES`, or ``quantization`` not one of `QUANTIZATIONS`.
        RuntimeError: JAX's backend did not start (as ``jax.devices()`` raises it).
    """
    if dtype not in SERVE_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(SERVE_DTYPES)}, got {dtype!r}")
    check_quantization(quantization, "quantization")
    folder = Path(folder)
    if dtype == "auto":
        stored = read_hf_config(folder)[1].stored_dtype
        dtype = stored if stored in SERVE_DTYPES[1:] else "float32"  # a stored dtype, never "auto"
    backend = start_backend()  # begun already by `halyard serve`; else it starts now, beside the reading
    _, host_model = read_hf_to_host(folder, dtype=dtype)
    on_host = served_model(host_model, folder, name or folder.resolve().name, chat_template=chat_template)
    backend.wait()
    # device_put, not jnp.asarray: that compiles a small program for each shape and dtype
    on_device = put_in_groups(on_host.model, transfer_limit())
    return dataclasses.replace(on_host, model=quantized(on_device, quantization))
