"""`tokenmill logs`: see :func:`service.client.main_logs`."""

import sys

from service.client import main_logs as main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
