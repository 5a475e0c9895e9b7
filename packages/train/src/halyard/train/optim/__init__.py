"""Optimizers (AdamW, Lion, Sophia-H, Muon) and schedules, built from small optax transformations.

    optimizer = AdamWConfig(learning_rate=3e-4).build(total_steps=1000)   # or optimizers.adamw(schedule, ...)
    state = optimizer.init(params)
    updates, state = optimizer.update(grads, state, params, loss_fn=lambda p: loss(p, batch))
    params = optax.apply_updates(params, updates)

Parameters may be any pytree, `NamedArray` leaves included. `loss_fn` is only used by Sophia-H. Nothing is
imported here: the configs are in `config` and `schedule_config`, the functions in `optimizers`.
"""
