"""Hosts of a run: one interface with two connectors (this machine, or SSH through paramiko), read-only facts about
a host, and the actions that change one (ship the render and images, run compose)."""
