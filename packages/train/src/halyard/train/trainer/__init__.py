"""The Trainer (`halyard.train.trainer.trainer`) and its compiled train step (`halyard.train.trainer.step`).

    from halyard.train.trainer.trainer import Trainer
    result = Trainer(config).fit()     # config: halyard.train.run_config.TrainConfig

Nothing is imported here: the run config imports `halyard.train.trainer.precision`, and the trainer
imports the run config.
"""
