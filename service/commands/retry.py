"""`tokenmill retry`: see :func:`service.client.main_retry`."""

import sys

from service.client import main_retry as main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
