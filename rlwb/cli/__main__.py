"""`python -m rlwb.cli ...`: the `rlwb` command."""

import sys

from rlwb.cli import main

sys.exit(main())
