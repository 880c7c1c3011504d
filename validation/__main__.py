"""Entry point: `python -m validation {run,compare,fit,fake-gpu} ...`."""

from __future__ import annotations

import sys

from validation.cli import main

if __name__ == "__main__":
    sys.exit(main())
