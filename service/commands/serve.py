"""`tokenmill serve`: see :func:`service.client.main_serve`."""

import sys

from service.client import main_serve as main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
