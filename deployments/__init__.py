"""How the flows run in production (schedules, serve, the watch-folder service)."""
