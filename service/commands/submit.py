"""`tokenmill submit`: see :func:`service.client.main_submit`."""

import sys

from service.client import main_submit as main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
