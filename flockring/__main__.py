"""``python -m flockring``."""

import sys

from flockring.cli import main

sys.exit(main())
