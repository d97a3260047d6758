"""`python -m benchmarks [--quick] [--only NAME] [--json PATH] [--png PATH]`."""

import sys

from .suite import main

sys.exit(main())
