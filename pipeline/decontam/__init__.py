"""Benchmark decontamination: an n-gram index of benchmark items, a stage that flags or drops overlaps, a report."""
