"""The run assembly: what a run derives from its config (`setup.RunSetup`), where its model comes from
(`sources`) and loading a run's weights without training (`loading`).

This layer sits above the components (checkpoints, optimizers, the step), the run config, the data assembly
and the features' pure pieces (LoRA adapters, objectives), and below the harness, the Trainer and the
commands. Nothing is imported here.
"""
