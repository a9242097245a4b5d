"""Code that runs inside the images, in one room per process: the TRL trainer (trainer/), the vLLM server and replica
proxy (serving/), the verl node and Ray (verl/), the run watcher (watch/), the shared volume (storage/), the tasks both
engines train on (tasks/) and `bench trainer` (bench/); beside them the per-container health and identity checks, the
tiny model builder and the network probe. The base it shares with the deployer is grpo_deploy.common."""
