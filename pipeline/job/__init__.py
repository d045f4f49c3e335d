"""The job engine: phases, events, state, Ray orchestration."""
