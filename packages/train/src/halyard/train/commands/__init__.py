"""The ``halyard`` subcommands that use a run without training it (``generate``, ``eval``, ``export``) and the
config printer (``config show``, ``train --print-config``); `halyard.train.cli` dispatches to them. Nothing
is imported here."""
