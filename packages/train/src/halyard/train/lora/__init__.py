"""LoRA fine-tuning in the trainer: the ``lora:`` section trains low-rank adapters on a frozen base.

The train state's parameters are the adapters (`halyard.models.lora`), so the optimizer state and the
gradients exist only for them and checkpoints hold only them, with a reference to the base (`base.LoraBase`);
the base is an argument of the train step, neither differentiated nor donated.
"""
