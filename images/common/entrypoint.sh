#!/bin/sh
# Entrypoint of every grpo-deploy image (started by tini as PID 1).
#
# Applies the umask the deployment asked for, so files the trainer or the
# server write into the shared volume (adapter configs, tokenizer files,
# checkpoints) are readable by the other role; then runs the role's command in
# place of this shell. Note: safetensors writes adapter weights 0600 whatever
# the umask, which is why both roles run as the same UID/GID.
set -eu

umask "${GRPO_UMASK:-0022}"

if [ "$#" -eq 0 ]; then
    cat >&2 <<'USAGE'
grpo-deploy image: give the command to run, for example
  python3 -m grpo_deploy.runtime.serving.serve --args-file FILE   (server role)
  python3 -m grpo_deploy.runtime.trainer.train ...                (trainer role)
USAGE
    exit 64
fi

exec "$@"
