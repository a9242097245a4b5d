"""One-off containers (grpo_deploy.hosts.oneoff): the docker run arguments of the one recipe, and the engine's own
error read out of a `docker run` that never started its container (the stderr below is what Docker 20.10 printed
here for an NFS volume that cannot be mounted), and the share a one-off container mounts: what compose mounts."""

from __future__ import annotations

from grpo_deploy import spec
from grpo_deploy.hosts import oneoff
from grpo_deploy.hosts.connect import Result
from grpo_deploy.spec import resolve
from tests.specs import loaded, spec_yaml

NFS_REFUSED = ("docker: Error response from daemon: failed to mount local volume: mount :/export:/var/lib/docker/"
               "volumes/5bb2/_data, data: addr=127.0.0.1,nfsvers=4.1,hard: no such device.\n"
               "Run 'docker run --help' for more information\n")


def test_the_engines_error_is_the_line_not_the_usage_hint():
    said = oneoff.engine_error(Result(125, "", NFS_REFUSED))
    assert said.startswith("failed to mount local volume") and "no such device" in said
    assert "--help" not in said


def test_a_command_that_ran_is_not_an_engine_error():
    assert oneoff.engine_error(Result(1, "", "rm: cannot remove '/shared/x': Permission denied\n")) is None
    assert oneoff.engine_error(Result(0, "ok", "")) is None


def test_the_fix_names_the_nfs_share_when_the_mount_failed():
    res = resolve.resolve(loaded(**{"storage.nfs": {"server": "10.0.0.5", "export": "/export/grpo"}}))
    fix = oneoff.start_failure_fix(res, "spark1", oneoff.engine_error(Result(125, "", NFS_REFUSED)))
    assert "storage.nfs 10.0.0.5:/export/grpo could not be mounted on spark1" in fix
    assert "permission" not in fix.lower()


class _Recorder:
    name = "local"

    def __init__(self):
        self.argv = None

    def run(self, argv, *, stdin=None, timeout=120):
        self.argv = argv
        return Result(0, "", "")


def test_the_recipe_is_labelled_removed_offline_and_mounts_the_share_as_the_stack_does():
    res = resolve.resolve(loaded("cpu", "trl-async", ["local"]))  # one host, the plain volume
    conn = _Recorder()
    oneoff.run(conn, "img:1", ["true"], ident=res.identities["trainer"], share=(res, None))
    argv = conn.argv
    assert argv[:3] == ["docker", "run", "--rm"] and argv[argv.index("--network") + 1] == "none"
    assert "--label" in argv and argv[argv.index("--user") + 1] == res.identities["trainer"].user
    assert argv[argv.index("-v") + 1] == f"{res.spec.storage.volume}:{res.spec.storage.mount}"
    assert argv[-2:] == ["img:1", "true"]


def _res(**changes):
    return resolve.resolve(spec.loads(spec_yaml("cpu", hosts=(), **changes)))


def _share(res):
    return oneoff.share_source(res, res.host_for(res.engine_info.main_role))


def test_share_source_is_what_compose_mounts(tmp_path):
    share = tmp_path / "share"
    assert _share(_res()) == ("grpo-deploy-shared", None)
    assert _share(_res(**{"hosts.0.shared_dir": str(share)})) == (str(share), None)
    nfs = _res(**{"storage.nfs": {"server": "10.0.0.5", "export": "/export/grpo"}})
    volume, opts = _share(nfs)
    assert volume == "grpo-deploy-shared"
    assert opts == {"type": "nfs", "o": "addr=10.0.0.5,nfsvers=4.1,hard,lookupcache=positive",
                    "device": ":/export/grpo"}


def test_preflight_probes_mount_what_compose_mounts_when_nfs_and_shared_dir_are_both_set(tmp_path):
    both = _res(**{"storage.nfs": {"server": "10.0.0.5", "export": "/export/grpo"},
                   "hosts.0.shared_dir": str(tmp_path / "share")})
    args = oneoff.share_args(both, both.host_for("trainer"))
    assert args[0] == "--mount" and "volume-opt=type=nfs" in args[1] and str(tmp_path) not in " ".join(args)


def test_an_env_file_is_passed_by_its_path_never_its_values():
    conn = _Recorder()
    oneoff.run(conn, "img:1", ["true"], env_file="/home/d/.grpo-deploy/r/secret/run-token.env")
    argv = conn.argv
    assert argv[argv.index("--env-file") + 1] == "/home/d/.grpo-deploy/r/secret/run-token.env"
    assert not any(a.startswith("GRPO_RUN_TOKEN") for a in argv) and argv[-2:] == ["img:1", "true"]
    oneoff.run(conn, "img:1", ["true"])
    assert "--env-file" not in conn.argv
