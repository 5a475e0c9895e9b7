"""The run's data assembly: from the ``data:`` section to the datasets a run trains and evaluates on (the
corpus, the tokenizer, the token cache built before or beside training, the splits, a mixture's batches).
README.md says which module holds what and what this layer may import. Import each name from its module:
this package exports nothing."""
