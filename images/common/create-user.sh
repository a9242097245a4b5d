#!/bin/sh
# create-user.sh UID GID [HOME]
#
# Gives the image a named, non-root run user "grpo" with exactly UID:GID and a
# writable home. Trainer and server must run as the same UID/GID, because
# safetensors writes adapter weights owner-only (0600); a passwd entry is
# needed because PyTorch's getpass() raises for a UID without one.
#
# Base images may already own the numbers (Ubuntu 24.04 images ship user
# "ubuntu" as 1000:1000, Debian has group "users" as 100): an existing group or
# user with the wanted number is renamed rather than duplicated.
set -eu

uid=${1:?usage: create-user.sh UID GID [HOME]}
gid=${2:?usage: create-user.sh UID GID [HOME]}
home=${3:-/home/grpo}

case "$uid$gid" in *[!0-9]*) echo "create-user.sh: UID and GID must be numbers" >&2; exit 1 ;; esac
if [ "$uid" -eq 0 ]; then
    echo "create-user.sh: the run user must not be root (UID 0)" >&2
    exit 1
fi

group=$(getent group "$gid" | cut -d: -f1 || true)
if [ -z "$group" ]; then
    groupadd --gid "$gid" grpo
elif [ "$group" != grpo ]; then
    if [ "$gid" -lt 1000 ]; then
        # A system group (e.g. "users"): keep its name, just join it.
        :
    else
        groupmod --new-name grpo "$group"
    fi
fi

user=$(getent passwd "$uid" | cut -d: -f1 || true)
if [ -z "$user" ]; then
    # --no-log-init: a large UID would otherwise make a huge sparse lastlog.
    useradd --uid "$uid" --gid "$gid" --home-dir "$home" --create-home \
        --no-log-init --shell /bin/bash grpo
else
    [ "$user" = grpo ] || usermod --login grpo "$user"
    if [ "$(getent passwd grpo | cut -d: -f4,6)" != "$gid:$home" ]; then
        usermod --gid "$gid" --home "$home" --move-home grpo
    fi
    mkdir -p "$home"
fi
chown "$uid:$gid" "$home"
chmod 0755 "$home"

# The caches under HOME (hub downloads, vLLM's compile cache, Triton's kernels)
# exist and belong to the run user: a Docker named volume mounted on one of
# them (compose mounts one on ~/.cache) starts as a copy of the image's
# directory, owner included; without it Docker creates the mount point
# root-owned and the run user cannot write its caches.
for dir in "$home/.cache" "$home/.cache/huggingface" "$home/.cache/vllm" "$home/.triton"; do
    install -d -o "$uid" -g "$gid" -m 0755 "$dir"
done

# /shared: the mount point of the volume that carries adapters and
# checkpoints. Owned by the run user so that an empty Docker named volume
# mounted there starts out owned by that user too.
install -d -o "$uid" -g "$gid" -m 0775 /shared
