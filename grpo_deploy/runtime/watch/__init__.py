"""The run watcher: the reward's trend, plateau and ratio band over a run's events (watcher), and `run_watch`, which
follows a live run's events file."""
