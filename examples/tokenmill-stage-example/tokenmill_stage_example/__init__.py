"""An example tokenmill stage package: :class:`~tokenmill_stage_example.filters.Blocklist`."""
