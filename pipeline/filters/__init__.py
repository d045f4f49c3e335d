"""Language identification and quality filters: fastText LID, Gopher / C4 / FineWeb rules, a fastText classifier.

Every filter runs in ``mode: annotate`` (verdict and scores into ``meta["filters"]``, nothing dropped) or
``mode: filter``; ``tokenmill report OUT`` shows what each rule would drop before a job cuts anything.
"""
