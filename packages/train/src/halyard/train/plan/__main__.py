"""``python -m halyard.train.plan``: the process `halyard plan` starts when it needs more simulated devices."""

import sys

from halyard.train.plan.command import plan_main

sys.exit(plan_main(sys.argv[1:]))
