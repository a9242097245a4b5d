#!/usr/bin/env bash
# Rehearse CI on a fresh machine without losing this one's Docker cache: a fresh clone of a commit (empty build/,
# no wheelhouse) runs `.ci/run` against a second Docker engine that holds nothing, in a network namespace and a
# mount namespace of its own (its own /var/lib/docker, /run, bridge and iptables), as CI would on a new machine.
# This machine's engine, its images and its containers are not touched. Wheel downloads may come from the pip cache.
#
#   sudo scripts/fresh-engine-ci.sh [COMMIT]      # default HEAD; the log and phase table go to build/fresh-engine/
#   FRESH_KEEP=1 scripts/fresh-engine-ci.sh       # keep the fresh engine's data root afterwards (tens of GB)
#   FRESH_COMMAND="make demo" scripts/fresh-engine-ci.sh   # another command than `CI=true bash .ci/run`
#   FRESH_LOAD=1 scripts/fresh-engine-ci.sh       # CI under load: N CPU-bound jobs (xz -9 of random bytes, normal
#                                                 # priority, about one core and 0.7 GB each) beside the whole run
#
# Root is needed (namespaces, a second dockerd). Exit status: that of .ci/run.
set -euo pipefail
# Run from a copy: bash reads a script as it goes, and the checkout's copy may be edited during an hour-long rehearsal.
if [ -z "${FRESH_SELF_COPY:-}" ]; then
  copy=$(mktemp /tmp/fresh-engine-ci.XXXXXX)
  cp "$0" "$copy"
  FRESH_SELF_COPY=$copy FRESH_REPO=$(cd "$(dirname "$0")/.." && pwd) exec bash "$copy" "$@"
fi
trap 'rm -f "$FRESH_SELF_COPY"' EXIT  # until cleanup's trap replaces it: an early refusal leaves no copy behind
cd "$FRESH_REPO"
REPO=$(pwd)
say() { printf '[fresh-engine] %s\n' "$*"; }
[ $# -le 1 ] || { say "usage: $0 [COMMIT]"; exit 2; }
case "${1:-HEAD}" in
  -*|*[!A-Za-z0-9._/~^-]*) say "COMMIT: '${1}' is not a commit name (letters, digits, . _ / ~ ^ -; no leading -)"; exit 2 ;;
esac
COMMIT=$(git rev-parse --verify --quiet --short "${1:-HEAD}^{commit}") \
  || { say "COMMIT: '${1:-HEAD}' names no commit of this repository (git log shows them)"; exit 2; }
SCRATCH=${FRESH_SCRATCH:-/var/tmp/grpo-fresh-engine}
MARK=.grpo-fresh-engine  # what makes a folder this script's scratch area: it only ever removes such a folder
case "$SCRATCH" in
  /*/*) ;;
  *) say "FRESH_SCRATCH: '$SCRATCH' must be an absolute path two levels down at least (it is removed afterwards)"; exit 2 ;;
esac
case "$SCRATCH" in
  */../*|*/..|*/./*|*/.|*//*|*[!A-Za-z0-9._/-]*)
    say "FRESH_SCRATCH: '$SCRATCH' must be a plain normalised path (letters, digits, . _ - /)"; exit 2 ;;
esac
if [ -e "$SCRATCH" ] && { [ -L "$SCRATCH" ] || [ ! -e "$SCRATCH/$MARK" ]; }; then
  say "FRESH_SCRATCH: $SCRATCH exists and is not this script's scratch folder (no $MARK in it): choose another"; exit 2
fi
NS=grpofresh
HOST_IF=gfresh-h NS_IF=gfresh-n
NET=10.231.77  # a /30 between this host and the namespace: .1 here, .2 there
OUT_DIR=$REPO/build/fresh-engine
STAMP=$(date +%Y%m%d-%H%M%S)
LOG=$OUT_DIR/ci-$COMMIT-$STAMP.log

LOAD=${FRESH_LOAD:-0}
case "$LOAD" in  # each job's xz -9 holds ~0.7 GB: a few are a load, many would be a memory test
  [0-8]) ;;
  *) say "FRESH_LOAD: '${LOAD//[^[:print:]]/?}' must be a number of CPU-bound jobs, 0 to 8"; exit 2 ;;
esac
LOAD=$((10#$LOAD))
load_pids=()
[ "$(id -u)" -eq 0 ] || { say "needs root (network and mount namespaces, a second dockerd)"; exit 2; }
if ip netns list 2>/dev/null | grep -qw "$NS"; then
  say "namespace $NS exists: another rehearsal is running (or one was killed: ip netns del $NS)"; exit 2
fi
mkdir -p "$OUT_DIR"

editable_before=$(python3 -m pip show grpo-deploy 2>/dev/null | sed -n 's/^Editable project location: //p')

cleanup() {
  set +e
  rm -f "$FRESH_SELF_COPY"
  for pid in "${load_pids[@]}"; do kill "$pid" 2>/dev/null; pkill -P "$pid" 2>/dev/null; done
  if [ -S "$SCRATCH/run/docker.sock" ]; then  # its containers first: their processes are in namespaces of their own
    fresh_docker=(docker -H "unix://$SCRATCH/run/docker.sock")
    timeout 300 "${fresh_docker[@]}" ps -aq 2>/dev/null | xargs -r timeout 300 "${fresh_docker[@]}" rm -f >/dev/null 2>&1
  fi
  if [ -f "$SCRATCH/run/docker.pid" ]; then  # the namespaced dockerd that .ci/run's setup started
    pid=$(cat "$SCRATCH/run/docker.pid" 2>/dev/null)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      kill "$pid"; for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
      kill -9 "$pid" 2>/dev/null
    fi
  fi
  ip netns pids "$NS" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns del "$NS" 2>/dev/null
  ip link del "$HOST_IF" 2>/dev/null
  iptables -t nat -D POSTROUTING -s "$NET.0/30" ! -o "$HOST_IF" -j MASQUERADE 2>/dev/null
  iptables -D FORWARD -i "$HOST_IF" -j ACCEPT 2>/dev/null
  iptables -D FORWARD -o "$HOST_IF" -j ACCEPT 2>/dev/null
  if [ -z "${FRESH_KEEP:-}" ]; then
    umount -R "$SCRATCH/run" 2>/dev/null
    rm -rf --one-file-system "$SCRATCH"
  fi
  if [ -n "$editable_before" ] && [ "$editable_before" != "$SCRATCH/src" ]; then  # setup.sh re-pointed it
    python3 -m pip install -q --no-deps --disable-pip-version-check --root-user-action=ignore -e "$editable_before" \
      >/dev/null 2>&1 || say "could not re-install $editable_before in editable mode: pip install -e $editable_before"
  fi
}
trap cleanup EXIT

rm -rf --one-file-system "$SCRATCH"
mkdir -p "$SCRATCH"/{docker,run,tmp}
touch "$SCRATCH/$MARK"
chmod 1777 "$SCRATCH/tmp"
say "cloning $COMMIT into $SCRATCH/src"
git clone -q "$REPO" "$SCRATCH/src"
git -C "$SCRATCH/src" checkout -q "$COMMIT"

say "network namespace $NS ($NET.2, NAT through this host)"
ip netns add "$NS"
ip link add "$HOST_IF" type veth peer name "$NS_IF"
ip link set "$NS_IF" netns "$NS"
ip addr add "$NET.1/30" dev "$HOST_IF"
ip link set "$HOST_IF" up
ip netns exec "$NS" ip addr add "$NET.2/30" dev "$NS_IF"
ip netns exec "$NS" ip link set "$NS_IF" up
ip netns exec "$NS" ip link set lo up
ip netns exec "$NS" ip route add default via "$NET.1"
sysctl -qw net.ipv4.ip_forward=1
iptables -t nat -A POSTROUTING -s "$NET.0/30" ! -o "$HOST_IF" -j MASQUERADE
iptables -I FORWARD -i "$HOST_IF" -j ACCEPT
iptables -I FORWARD -o "$HOST_IF" -j ACCEPT

for _ in $(seq 1 "$LOAD"); do  # the load: each a shell looping one single-threaded compressor
  ( trap 'exit 0' TERM; while :; do head -c 268435456 /dev/urandom | xz -9 -T1 >/dev/null; done ) &
  load_pids+=("$!")
done
[ "$LOAD" -eq 0 ] || say "under load: $LOAD CPU-bound job(s) beside the run (xz -9, one core each)"
say "running ${FRESH_COMMAND:-.ci/run} against an empty engine (log: $LOG)"
set +e
# `env --default-signal`: started in the background (`... &`, nohup), a shell hands its children SIGINT ignored, and a
# Python started so never turns Ctrl-C into KeyboardInterrupt (the Ctrl-C fault test would see `up` run on).
# Inside (nsenter, not `ip netns exec`: that remounts /sys and hides the cgroup hierarchies dockerd needs): a private mount namespace where /var/lib/docker and /run are empty folders of the scratch area, so the
# dockerd that .ci/run's setup starts is a new engine with nothing in it (and its socket is the default one); /tmp
# is empty too (pytest's temporary folders of another session stay apart).
env --default-signal=INT,QUIT nsenter --net=/run/netns/"$NS" unshare --mount --propagation private bash -c '
  set -e
  mkdir -p /var/lib/docker
  mount --bind "$1/docker" /var/lib/docker
  mount --bind "$1/run" /run
  mount --bind "$1/tmp" /tmp
  cd "$1/src"
  eval "$2"
' fresh "$SCRATCH" "${FRESH_COMMAND:-CI=true bash .ci/run}" >"$LOG" 2>&1
rc=$?
set -e
tail -n 40 "$LOG" | sed -n '/== CI phase times ==/,$p'
say "commit $COMMIT: ${FRESH_COMMAND:-.ci/run} exit $rc$([ "$LOAD" -eq 0 ] || echo ", under load of $LOAD job(s)") (full log: $LOG)"
exit "$rc"
