"""``tokenmill card OUT [--compare OTHER ...]``: (re)build a finished output's dataset card, ``OUT/README.md``
(an output carded before the card was its README: its ``CARD.md`` is replaced by it)."""

from __future__ import annotations

import argparse
import sys
import time

from pipeline import storage
from pipeline.card.build import write_card
from pipeline.card.collect import CARD_DIR, OLD_CARD
from pipeline.output.layout import OutputError
from pipeline.output.open_store import open_output_dir


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tokenmill card", description=__doc__)
    p.add_argument("output", help="a finished output folder (or URI)")
    p.add_argument("--compare", action="append", default=[], metavar="OTHER",
                   help="an earlier output to compare with (repeat: oldest first; the last is the one compared)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    for folder in [args.output, *args.compare]:
        if not storage.exists(storage.join(folder, "stats.json")):
            print(f"error: {folder}: no stats.json (not a finished tokenmill output)", file=sys.stderr)
            return 2
    out = open_output_dir(args.output)
    try:
        if not out.is_tokenmill():  # a copy of an output (no .tokenmill/): the card is written beside its files
            names = write_card(args.output, args.compare)
        else:
            with out.lock():  # no job publishes into the folder meanwhile
                names = write_card(args.output, args.compare)
            out.add_published(names, drop=[OLD_CARD])  # listed, so it is served and replaced like the rest
    except (OutputError, ValueError) as exc:  # a job holds the folder; a card/spec.yaml that cannot be read
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"card: {storage.join(args.output, names[0])} and {len(names) - 1} files in {CARD_DIR}/ "
          f"({time.perf_counter() - t0:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
