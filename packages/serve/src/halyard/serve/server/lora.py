"""``--lora NAME=FOLDER``: LoRA adapters served beside the base model (`halyard.serve.adapters`), each from a
PEFT adapter folder (adapter_config.json, adapter_model.safetensors) or, through ``halyard serve``, a
Halyard training run trained with LoRA; a request picks one with ``model: NAME``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from halyard.models.lora import Adapters
from halyard.serve.server.options import OptionError

if TYPE_CHECKING:
    from halyard.models import CausalLM
    from halyard.serve.server.loading import ServedModel

RunReader = Callable[[Path], Adapters]
"""Reads a training run folder's adapters (`halyard.train.run.loading.load_run_adapters`)."""


def lora_specs(values: Sequence[str] | None) -> list[tuple[str, Path]]:
    """The ``--lora NAME=FOLDER`` options as ``(name, folder)`` pairs, in order.

    Raises:
        OptionError: a value without ``=``, an empty name, a name given twice, or a folder that does not exist.
    """
    specs: list[tuple[str, Path]] = []
    for value in values or ():
        name, equals, folder = value.partition("=")
        if not equals or not name or not folder:
            raise OptionError(f"--lora {value}: give NAME=FOLDER (the name requests send as their model)")
        if name in (seen for seen, _ in specs):
            raise OptionError(
                f"--lora {value}: the name {name!r} is given twice; give each adapter its own name"
            )
        if not Path(folder).is_dir():
            raise OptionError(
                f"--lora {value}: {folder} is no folder (a PEFT adapter folder or a training run)"
            )
        specs.append((name, Path(folder)))
    return specs


def read_adapter(model: CausalLM, folder: Path, read_run: RunReader | None) -> Adapters:
    """The adapters of ``folder`` for ``model``: a PEFT adapter folder, or a training run by ``read_run``.

    Raises:
        OptionError: the folder is neither, or a run folder without ``read_run``.
    """
    from halyard.export.peft_reading import read_peft_adapter

    if (folder / "adapter_config.json").is_file():
        return read_peft_adapter(model, folder)
    if (folder / "config.yaml").is_file():
        if read_run is None:
            raise OptionError(
                f"{folder} is a training run: serve it with halyard serve (halyard-train), or export its "
                "adapter first (halyard export --run RUN --lora adapter --out FOLDER)"
            )
        return read_run(folder)
    raise OptionError(f"{folder} holds neither adapter_config.json (PEFT) nor config.yaml (a training run)")


def with_lora(
    served: ServedModel, specs: Sequence[tuple[str, Path]], read_run: RunReader | None = None
) -> ServedModel:
    """``served`` (a `ServedModel`) serving the adapters of ``specs`` beside its base (``served.adapters``
    lists their names: request ``model: NAME`` runs adapter ``i + 1``).

    Raises:
        OptionError: naming the ``--lora`` option: a name that is the base's, an unreadable adapter, or one
            that does not fit the base (its targets, layers or sizes).
    """
    from halyard.export import HfConversionError
    from halyard.serve.adapters import AdapterError, with_adapters

    if not specs:
        return served
    loaded = []
    for name, folder in specs:
        where = f"--lora {name}={folder}"
        if name == served.name:
            raise OptionError(f"{where}: {name!r} is the base model's name; give the adapter another name")
        try:
            loaded.append((name, read_adapter(served.model, folder, read_run)))
        except (OptionError, HfConversionError, ValueError) as error:
            raise OptionError(f"{where}: {' '.join(str(error).split())}") from None
    try:
        model = with_adapters(served.model, loaded)
    except AdapterError as error:
        raise OptionError(f"--lora: {error}") from None
    return dataclasses.replace(served, model=model, adapters=tuple(name for name, _ in loaded))
