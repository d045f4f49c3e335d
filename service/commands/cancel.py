"""`tokenmill cancel`: see :func:`service.client.main_cancel`."""

import sys

from service.client import main_cancel as main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
