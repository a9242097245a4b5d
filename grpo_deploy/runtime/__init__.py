"""Code that runs inside the images (the trainer, the verl node, the vLLM server and replica proxy, the watcher, the
share's checkpoints and probes, `bench trainer`, the per-container health and identity), and the kit's shared base
the deployer imports too: values, strict, shown, readback, table, dirlock, metrics."""
