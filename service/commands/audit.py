"""`tokenmill audit`: see :func:`service.client.main_audit`."""

import sys

from service.client import main_audit as main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
