"""Trackers: a tiny protocol (`log(metrics, step)`, `log_summary(metrics)`, `finish()`) and its sinks.

tracker = build_trackers([JsonlTrackerConfig(), WandbTrackerConfig()], run_dir,
                         hyperparameters=flatten_config(config), resume_step=None)
tracker.log({"train/loss": 2.3, "train/learning_rate": 1e-3}, step=10)
tracker.log_summary({"goodput/step_fraction": 0.93})
tracker.finish()
"""
