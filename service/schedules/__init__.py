"""Scheduled corpus refreshes: cron slots (:mod:`.cron`), which inputs changed (:mod:`.fingerprints`), the
versioned output folder and each run's job spec (:mod:`.versions`), and the thread that fires and publishes
(:mod:`.scheduler`)."""
