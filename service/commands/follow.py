"""`tokenmill follow`: see :func:`service.client.main_follow`."""

import sys

from service.client import main_follow as main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
