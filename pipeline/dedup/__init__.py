"""Near and exact deduplication: the stages (light modules) and their Ray tasks."""
