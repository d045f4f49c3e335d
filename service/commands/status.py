"""`tokenmill status`: see :func:`service.client.main_status`."""

import sys

from service.client import main_status as main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
