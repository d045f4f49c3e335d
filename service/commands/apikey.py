"""`tokenmill apikey`: see :func:`service.client.main_apikey`."""

import sys

from service.client import main_apikey as main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
