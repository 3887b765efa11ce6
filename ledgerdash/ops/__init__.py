"""Running the service: health checks, metrics, request logs, database trouble."""
