"""What lives on the shared volume: checkpoints and resume, the adapters handed to the server, the share probe, and
the injected storage faults of the rehearsal."""
