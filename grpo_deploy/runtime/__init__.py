"""Code that runs inside the images: trainer entrypoint, attention shim, rewards, data, adapters, metrics."""
