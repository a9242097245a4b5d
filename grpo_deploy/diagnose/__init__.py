"""The `diagnose` verb's work: a run's bottleneck from its own step events, per engine (trl_async, verl), on the types
and text they share (base). Each engine's `diagnose` method calls its module; the CLI prints base.diagnosis_text."""
