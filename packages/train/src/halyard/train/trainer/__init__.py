"""The Trainer (`halyard.train.trainer.trainer`) and its compiled train step (`halyard.train.step`).

    from halyard.train.trainer.trainer import Trainer
    result = Trainer(config).fit()     # config: halyard.train.run_config.TrainConfig

Nothing is imported here: importing one piece (the step, the loss) does not import the whole trainer.
"""
