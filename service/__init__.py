"""Control plane: CLI today; the FastAPI service, job store and scheduler build on it."""
