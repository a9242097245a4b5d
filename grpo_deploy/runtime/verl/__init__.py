"""The verl node (head or worker of a Ray cluster) inside the verl image: the node entrypoint, verl's data and reward
files, the Ray cluster's checks, and the CPU rehearsal's platform plugin."""
