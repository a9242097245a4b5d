"""Multi-host figures on real test hosts (tests/testhosts.py), printed, not asserted:

1. preflight wall time for 2 and for 8 hosts (one spec engine, every host checked in parallel; target 8/2 <= 1.5);
2. bytes and seconds shipped: a host without the image, the same image again (target: nothing sent), and after a
   code-only change (a new thin layer on the same dependency image; target: under 100 MB);
3. split `up` -> first optimizer step (trainer and server on two hosts) against the local `up` -> first step of the
   same image on this machine (target: ratio <= 1.2); images already on the hosts, so shipping is not in the figure;
4. verl's Ray cluster up on 2 and on 4 hosts (the cpu verl rehearsal: head on the first, a worker on each other):
   the head's start to every worker joined and counted, and the head's Ray answering to that (target 4/2 <= 1.3);
   the verl image already on the hosts, and `up` stopped (Ctrl-C: rolled back) once the cluster formed. Each test
   host, its containers included, is held to --host-cpus CPUs (default 0.4): four hosts then never share the
   machine's cores (4 x 0.4 < 2), as four separate machines would not, and the 2-host figure runs under the same
   limit. Without the limit (--host-cpus 0) all hosts share 2 cores and the figure measures the contention.

Run: python benchmarks/multihost.py [--part preflight|shipping|split|cluster ...]   (needs the cpu image: make images;
the cluster part the verl-cpu image)
`make bench` (CI) runs the preflight part; `make bench-shipping`, `make bench-split` and `make bench-cluster` the
others (minutes each).
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from grpo_deploy.hosts.connect import SshHost, SshOptions  # noqa: E402
from grpo_deploy.hosts.ship import ship  # noqa: E402
from grpo_deploy.spec import new_spec  # noqa: E402
from tests.testhosts import SHARED_DIR, test_hosts  # noqa: E402

IMAGE = "grpo-deploy/cpu:0.1.0"
VERL_IMAGE = "grpo-deploy/verl-cpu:0.1.0"


def cli(*args: str, cwd: Path, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpo_deploy.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def verl_spec(path: Path, names: list[str]) -> Path:
    """A verl spec over the given hosts (head + workers): any host count, every check runs on every host."""
    data = yaml.safe_load(new_spec.spec_text("a100", "verl", names))
    data["storage"]["nfs"] = None
    for host in data["hosts"]:
        host["shared_dir"] = SHARED_DIR
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def preflight_seconds(n: int, work: Path, repeat: int = 3) -> float:
    with test_hosts(n, work) as hosts:
        spec = verl_spec(work / f"verl-{n}.yaml", [h.name for h in hosts])
        times = []
        for _ in range(repeat):
            start = time.time()
            proc = cli("preflight", "-f", str(spec), "--ssh-config", str(hosts.ssh_config), "--json", cwd=work)
            times.append(time.time() - start)
            # A figure counts only when every check ran on every host (exit 0 or 1 with a full table), not when
            # preflight stopped at the door.
            checked = {row.get("host") for row in json.loads(proc.stdout or "{}").get("checks", [])} \
                if proc.returncode in (0, 1) else set()
            if not {h.name for h in hosts} <= checked:
                raise SystemExit(f"preflight over {n} hosts did not check every host (exit {proc.returncode}):\n"
                                 f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return sorted(times)[len(times) // 2]


def shipping(work: Path) -> list[dict]:
    rows = []
    with test_hosts(1, work, fresh=True, volume_prefix="grpo-benchhost") as hosts:
        target = SshHost("spark1", "spark1", SshOptions(str(hosts.ssh_config)))
        for case, tag in (("host without the image", IMAGE), ("same image again", IMAGE)):
            s = ship(tag, target)
            rows.append({"case": case, "mb": round(s.bytes_sent / 1e6, 1), "seconds": s.seconds,
                         "layers_sent": s.layers_sent, "layers_skipped": s.layers_skipped})
        changed = "grpo-deploy/cpu:bench-code-change"
        # The image runs as its non-root user and the kit's files are root's: the edit is made as root, and the
        # image's own user is restored after it.
        user = subprocess.run(["docker", "image", "inspect", "-f", "{{.Config.User}}", IMAGE], check=True,
                              capture_output=True, text=True).stdout.strip() or "0"
        built = subprocess.run(["docker", "build", "-q", "-t", changed, "-"], capture_output=True, text=True,
                               input=f"FROM {IMAGE}\nUSER 0\nRUN echo '# changed {time.time()}' >> "
                                     f"/opt/grpo-deploy/lib/grpo_deploy/__init__.py\nUSER {user}\n")
        if built.returncode != 0:
            raise SystemExit(f"building the code-change image failed:\n{built.stderr[-2000:]}")
        start = time.time()
        s = ship(changed, target)
        rows.append({"case": "after a code-only change", "mb": round(s.bytes_sent / 1e6, 1),
                     "seconds": round(time.time() - start, 1), "ship_seconds": s.seconds,
                     "layers_sent": s.layers_sent, "layers_skipped": s.layers_skipped})
        target.close()
        subprocess.run(["docker", "rmi", changed], capture_output=True)
    return rows


def first_step_seconds(cwd: Path, *args: str) -> float | None:
    proc = cli("up", "--fresh", *args, cwd=cwd)
    status = cli("status", "--json", *args, cwd=cwd, timeout=300)
    cli("down", *args, cwd=cwd, timeout=300)
    if proc.returncode != 0 or status.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-2000:])
        return None
    return json.loads(status.stdout).get("up_to_first_step_s")


def split_vs_local(work: Path) -> dict:
    local = first_step_seconds(work / "local")
    with test_hosts(2, work) as hosts:
        data = yaml.safe_load(new_spec.spec_text("cpu", "trl-async", ["spark1", "spark2"]))
        data["run"]["name"] = "bench-split"
        data["storage"]["nfs"] = None
        for host in data["hosts"]:
            host["shared_dir"] = SHARED_DIR
        spec = work / "split" / "split.yaml"
        spec.write_text(yaml.safe_dump(data, sort_keys=False))
        ssh = ["-f", str(spec), "--ssh-config", str(hosts.ssh_config)]
        cli("preflight", *ssh, cwd=spec.parent)  # warm-up of the SSH path is not what is measured
        for h in hosts:  # images present before the timed run: shipping is measured above
            ship(IMAGE, SshHost(h.name, h.name, SshOptions(str(hosts.ssh_config))))
        split = first_step_seconds(spec.parent, *ssh)
    return {"local_s": local, "split_s": split,
            "ratio": round(split / local, 2) if split and local else None}


FORMED = re.compile(r"Ray head up in ([0-9.]+) s|Ray cluster formed in ([0-9.]+) s")


def cluster_up_seconds(n: int, work: Path, cpus: float | None = None) -> dict:
    """One `up` of the cpu verl rehearsal over *n* test hosts (each held to *cpus* CPUs), stopped (SIGINT) once the
    cluster formed."""
    with test_hosts(n, work / f"hosts-{n}", cpus=cpus) as hosts:
        names = [h.name for h in hosts]
        data = yaml.safe_load(new_spec.spec_text("cpu", "verl", names))
        data["run"]["name"] = f"bench-cluster-{n}"
        data["storage"]["nfs"] = None
        for host in data["hosts"]:
            host["shared_dir"] = SHARED_DIR
        spec = work / f"cluster-{n}.yaml"
        spec.write_text(yaml.safe_dump(data, sort_keys=False))
        ssh = ["-f", str(spec), "--ssh-config", str(hosts.ssh_config)]
        for h in hosts:  # the image present before the timed run: shipping is measured above
            print(f"  {h.name}: {ship(VERL_IMAGE, SshHost(h.name, h.name, SshOptions(str(hosts.ssh_config)))).status}",
                  flush=True)
        proc = subprocess.Popen([sys.executable, "-m", "grpo_deploy.cli", "up", "--fresh", *ssh], cwd=work,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        head = formed = None
        deadline = time.time() + 900
        for line in proc.stdout:
            m = FORMED.search(line)
            if m and m.group(1):
                head = float(m.group(1))
            elif m:
                formed = float(m.group(2))
                proc.send_signal(signal.SIGINT)  # rolls back what it started
            if time.time() > deadline:
                proc.kill()
        proc.wait(timeout=300)
        cli("down", *ssh, cwd=work, timeout=300)
    return {"hosts": n, "head_s": head, "formed_s": formed,
            "joined_s": round(formed - head, 1) if formed is not None and head is not None else None}


PARTS = ("preflight", "shipping", "split", "cluster")


def _host_cpus(text: str) -> float:
    """--host-cpus: 0 (no limit) or a CPU count from 0.1 to 64."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of CPUs") from None
    if value != 0 and not 0.1 <= value <= 64:
        raise argparse.ArgumentTypeError(f"{text}: give 0 (no limit) or 0.1 to 64")
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", action="append", choices=PARTS,
                        help="run only this part (repeatable; default: all four, numbered as above)")
    parser.add_argument("--host-cpus", type=_host_cpus, default=0.4, metavar="CPUS",
                        help="the cluster part: CPUs each test host may use (0: no limit; default 0.4)")
    args = parser.parse_args()
    parts = args.part or list(PARTS)
    work = Path(tempfile.mkdtemp(prefix="grpo-bench-multihost-"))
    for sub in ("local", "split"):
        (work / sub).mkdir()
    if "preflight" in parts:
        two, eight = preflight_seconds(2, work), preflight_seconds(8, work)
        print(f"preflight: 2 hosts {two:.2f} s, 8 hosts {eight:.2f} s (median of 3), ratio {eight / two:.2f} "
              f"(target <= 1.5)", flush=True)
    if "shipping" in parts:
        for row in shipping(work):
            print(f"shipping, {row['case']}: {row['mb']:,} MB in {row['seconds']} s "
                  f"({row['layers_sent']} layer(s) sent, {row['layers_skipped']} already there)", flush=True)
    if "split" in parts:
        r = split_vs_local(work)
        print(f"up -> first step: local {r['local_s']} s, split over two hosts {r['split_s']} s, ratio {r['ratio']} "
              "(target <= 1.2)")
    if "cluster" in parts:
        cpus = args.host_cpus or None
        print(f"verl Ray cluster: each test host held to {cpus} CPUs" if cpus else
              "verl Ray cluster: test hosts unlimited (all share this machine's cores)", flush=True)
        two, four = cluster_up_seconds(2, work, cpus), cluster_up_seconds(4, work, cpus)
        for r in (two, four):
            print(f"verl Ray cluster, {r['hosts']} hosts: head's start -> every worker joined and counted "
                  f"{r['formed_s']} s (the head's Ray answering after {r['head_s']} s; workers joined in "
                  f"{r['joined_s']} s after it)", flush=True)
        if two["formed_s"] and four["formed_s"]:
            print(f"verl Ray cluster: 4 hosts / 2 hosts = {four['formed_s'] / two['formed_s']:.2f} (target <= 1.3)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
