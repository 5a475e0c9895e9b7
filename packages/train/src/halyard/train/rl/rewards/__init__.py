"""Reward functions of a prompt, a completion and the reference answer, for RL with verifiable rewards.

``rl.rewards`` names them (`load_reward`): the built-ins ``math`` (math-verify, as TRL's
``accuracy_reward``), ``exact`` and ``format:REGEX``, and functions of yours, ``module.path:function``,
each ``(prompt: str, completion: str, answer: str) -> float``. `load_rewards` weighs several
(``rl.reward_weights``) into a `RewardSet`, whose ``score`` returns the weighted sum and each function's
rewards; a function that raises stops scoring with a one-line `RewardError` naming it and the example.
`overlong_penalty` is DAPO's penalty of a completion's length in tokens, added to those rewards.
"""
