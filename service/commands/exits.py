"""The exit codes every ``tokenmill`` command shares, and the one way a command reports a problem.

0 done; 1 a failure of the program, the machine or the server (Ray lost a worker, a bug, a 5xx, no answer);
2 what the user gave cannot be used (an invalid spec, an existing output, bad input, a request the server
refused with a 4xx), printed without a traceback; 130 a cancelled job (SIGINT, SIGTERM), like a shell's code for a
process stopped by SIGINT; 141 the reader of the output went away (``tokenmill inspect OUT | head``), a shell's code
for a process stopped by SIGPIPE, printed without a traceback.
"""

from __future__ import annotations

import sys

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_CANCELLED = 130
EXIT_PIPE_CLOSED = 141


def error(msg: object, code: int = EXIT_USAGE) -> int:
    """Print ``msg`` as ``error: LINE`` lines on stderr (one per problem) and return ``code``."""
    for line in str(msg).splitlines():
        print(f"error: {line}", file=sys.stderr, flush=True)
    return code
