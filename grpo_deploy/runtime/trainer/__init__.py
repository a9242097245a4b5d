"""The TRL trainer process (trl-async): the entrypoint (train), its config schema, callbacks and hooks into TRL,
the speed switches and attention shim, the launcher of several processes, and the disk watchdog."""
