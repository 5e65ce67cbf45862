"""`python -m mambaradix.cli ...` == `mambaradix ...`."""

from __future__ import annotations

import sys

from mambaradix.cli import main

sys.exit(main())
