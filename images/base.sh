#!/usr/bin/env bash
# The one build step that needs root: debootstrap a minimal Debian bookworm into ROOTFS for the kit's base image.
# Called by `grpo-deploy images base` (grpo_deploy/image_build/base.py), which imports ROOTFS with the Docker SDK.
# Usage: base.sh ROOTFS [MIRROR [SECURITY_MIRROR]]   (no MIRROR: debootstrap's default)
set -euo pipefail
rootfs=${1:?usage: base.sh ROOTFS [MIRROR [SECURITY_MIRROR]]}
mirror=${2:-}
security=${3:-}
# debootstrap mounts /proc and /sys in the target; never leave them mounted below ROOTFS.
unmount_below() {
  awk -v root="$rootfs" 'index($2, root "/") == 1 { print $2 }' /proc/mounts | sort -r |
    while read -r mnt; do umount -l "$mnt" 2>/dev/null || true; done
}
trap unmount_below EXIT
debootstrap --variant=minbase bookworm "$rootfs" ${mirror:+"$mirror"}
if [[ -n $mirror ]]; then
  {
    echo "deb $mirror bookworm main"
    echo "deb $mirror bookworm-updates main"
    if [[ -n $security ]]; then echo "deb $security bookworm-security main"; fi
  } >"$rootfs/etc/apt/sources.list"
fi
# Keep images small: no recommends, no apt caches in later layers.
printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
  >"$rootfs/etc/apt/apt.conf.d/90grpo-deploy-no-recommends"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
