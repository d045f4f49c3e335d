"""Running jobs: ``supervisor`` (queue, limit, reconciler), ``job_process`` (one attempt's process)."""
