"""Reinforcement learning with verifiable rewards (``trainer.objective: grpo``).

`losses` holds the GRPO family's advantages and policy loss as pure JAX functions of per-token
log-probabilities; `importance` the correction for the sampler's log-probabilities; `rewards` the reward
functions a rollout is scored with.
"""
