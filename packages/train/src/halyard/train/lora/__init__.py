"""LoRA fine-tuning in the trainer: the ``lora:`` section trains low-rank adapters on a frozen base.

The train state's parameters are the adapters (`halyard.models.lora`), so the optimizer state and the
gradients exist only for them and checkpoints hold only them, with a reference to the base (`LoraBase`);
the base is an argument of the train step, neither differentiated nor donated.
"""

from halyard.train.lora.adapters import join, lora_loss_fn, trainable_params, with_base
from halyard.train.lora.base import LoraBase, abstract_base, check_lora, checkpoint_metadata, load_lora_base

__all__ = [
    "LoraBase",
    "abstract_base",
    "check_lora",
    "checkpoint_metadata",
    "join",
    "load_lora_base",
    "lora_loss_fn",
    "trainable_params",
    "with_base",
]
