"""What a job writes: shard sets, curated documents; and reading them back."""
