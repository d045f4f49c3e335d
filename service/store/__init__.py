"""The control plane's state in SQL: ``db`` (engine, migrations), ``models`` (tables), ``repo`` (queries)."""
