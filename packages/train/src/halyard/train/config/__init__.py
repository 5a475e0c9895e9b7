"""Configs: frozen dataclasses that are the YAML schema, the command line and the documentation at once.

    config = parse_config(TrainConfig, sys.argv[1:])            # defaults < --config FILE < --a.b value
    save_resolved_config(config, run_dir)                         # run_dir/config.yaml, parses back equal

Polymorphic sections are `choices.choice_section` bases and pick their class with `type:`. Mistakes raise
`ConfigError`; wrap `main` in `exit_on_config_error` to print them and exit with code 2.
"""
