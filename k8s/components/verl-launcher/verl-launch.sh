#!/bin/sh
# Starts verl.trainer.main_ppo with the rendered Hydra overrides (/etc/grpo-deploy/verl-overrides.txt, one per
# line). The single-node Job runs it as its container's args; the RayJob runs it as its entrypoint on the Ray head
# (`ray job submit` sets RAY_ADDRESS, so main_ppo joins the running cluster instead of starting its own).
# IFS is a newline and globbing is off, so a value such as trainer.logger=["console"] reaches Hydra byte for byte.
set -euf
overrides=/etc/grpo-deploy/verl-overrides.txt
test -s "$overrides" || { echo "missing or empty: $overrides" >&2; exit 2; }
IFS='
'
exec python3 -m verl.trainer.main_ppo $(grep -v -e '^#' -e '^[[:space:]]*$' "$overrides")
