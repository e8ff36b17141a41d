"""Supervisor: starts, watches, restarts and stops the services of a run."""
