"""`python -m slogate`: the same dispatcher as the `slogate` command. Never does anything else."""

import sys

from slogate.cli import main

sys.exit(main())
