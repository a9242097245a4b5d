#!/usr/bin/env bash
# The one build step that needs root: debootstrap a minimal Debian or Ubuntu suite into ROOTFS for the kit's base
# image. Called by `grpo-deploy images base` (grpo_deploy/image_build/base.py, which holds the suite table and
# imports ROOTFS with the Docker SDK).
# Usage: base.sh [--suite S] [--components a,b] [--keyring FILE] [--script NAME] [--pockets "updates security"]
#                [--arch ARCH]
#                ROOTFS [MIRROR [SECURITY_MIRROR]]
# Defaults: bookworm, main, debootstrap's own keyring and script. No MIRROR: debootstrap's default for the suite.
# --pockets: SUITE-<pocket> lines on the same mirror in the image's sources.list (with no MIRROR, the one debootstrap
# used). A keyring is only ever added: the Release file's signature is always checked.
set -euo pipefail
suite=bookworm components=main keyring='' script='' pockets='' arch=''
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --suite) suite=$2 ;;
    --components) components=$2 ;;
    --keyring) keyring=$2 ;;
    --script) script=$2 ;;
    --pockets) pockets=$2 ;;
    --arch) arch=$2 ;;
    *) echo "base.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
rootfs=${1:?usage: base.sh [options] ROOTFS [MIRROR [SECURITY_MIRROR]]}
mirror=${2:-}
security=${3:-}
# debootstrap mounts /proc and /sys in the target; never leave them mounted below ROOTFS.
unmount_below() {
  awk -v root="$rootfs" 'index($2, root "/") == 1 { print $2 }' /proc/mounts | sort -r |
    while read -r mnt; do umount -l "$mnt" 2>/dev/null || true; done
}
trap unmount_below EXIT
args=(--variant=minbase --components="$components")
if [[ -n $keyring ]]; then args+=(--keyring="$keyring"); fi
# Another architecture: debootstrap runs its second stage through the host's QEMU binfmt handler.
if [[ -n $arch ]]; then args+=(--arch="$arch"); fi
args+=("$suite" "$rootfs")
# An empty MIRROR argument is debootstrap's default mirror for the suite; SCRIPT (4th argument) needs one before it.
if [[ -n $mirror || -n $script ]]; then args+=("$mirror"); fi
if [[ -n $script ]]; then args+=("$script"); fi
debootstrap "${args[@]}"
if [[ -n $mirror || -n $pockets ]]; then
  # The mirror debootstrap wrote (its default when no MIRROR was given), then the suite's other pockets on it.
  uri=${mirror:-$(awk '$1 == "deb" { print $2; exit }' "$rootfs/etc/apt/sources.list")}
  words=${components//,/ }
  {
    echo "deb $uri $suite $words"
    if [[ -n $mirror && -z $pockets ]]; then echo "deb $uri $suite-updates $words"; fi
    for pocket in $pockets; do echo "deb $uri $suite-$pocket $words"; done
    if [[ -n $security ]]; then echo "deb $security $suite-security $words"; fi
  } >"$rootfs/etc/apt/sources.list"
fi
# Keep images small: no recommends, no apt caches in later layers.
printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
  >"$rootfs/etc/apt/apt.conf.d/90grpo-deploy-no-recommends"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
