"""``python -m halyard.data``: see ``halyard.data.cli``."""

import sys

from halyard.data.cli import main

if __name__ == "__main__":
    sys.exit(main())
