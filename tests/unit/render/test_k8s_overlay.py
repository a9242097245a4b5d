"""Tests of grpo_deploy.render.k8s_overlay and its verbs (`grpo-deploy k8s render|check OVERLAY`): the placeholder and
registry door, a stale generated/, hostile OVERLAY arguments (one line, exit 2, nothing written)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from grpo_deploy import cli
from grpo_deploy.render import k8s_overlay

K8S = Path(__file__).resolve().parents[3] / "k8s"


@pytest.mark.parametrize("host", ["192.0.2.10", "198.51.100.7", "203.0.113.250", "2001:db8::5", "[2001:db8::5]",
                                  "registry.invalid", "nfs.example", "nfs.test", "files.example.com", "EXAMPLE.ORG."])
def test_placeholder_hosts(host):
    assert k8s_overlay.placeholder_host(host)


@pytest.mark.parametrize("host", ["10.0.0.5", "192.0.3.10", "nfs1.lab.internal", "fd00::1", "examples.com",
                                  "registry.lab.internal:5000"])
def test_real_hosts(host):
    assert not k8s_overlay.placeholder_host(host)


@pytest.mark.parametrize(("image", "registry"), [
    ("grpo-deploy/vllm:0.1.0", None), ("vllm:1", None), ("registry.invalid/grpo-deploy/vllm:1", "registry.invalid"),
    ("localhost:5000/grpo/vllm:1", "localhost:5000"), ("localhost/vllm:1", "localhost"),
    ("reg.lab:443/a/b:1@sha256:" + "a" * 64, "reg.lab:443")])
def test_image_registry(image, registry):
    assert k8s_overlay.image_registry(image) == registry


def copy_overlay(tmp_path: Path, name: str) -> Path:
    shutil.copytree(K8S, tmp_path / "k8s")
    return tmp_path / "k8s" / name


def edit_spec(overlay: Path, edit) -> None:
    data = yaml.safe_load((overlay / "spec.yaml").read_text())
    edit(data)
    (overlay / "spec.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def one_line_refusal(capsys, argv: list[str]) -> str:
    assert cli.main(argv) == 2
    out = capsys.readouterr()
    assert not out.out and out.err.count("\n") == 1 and out.err.startswith("error: "), out
    return out.err


def test_check_walks_the_user_through_what_to_set(tmp_path, capsys):
    overlay = copy_overlay(tmp_path, "gb10")
    before = snapshot(tmp_path)
    err = one_line_refusal(capsys, ["k8s", "check", str(overlay)])
    assert "storage.nfs.server 192.0.2.10" in err and "(and 2 more" in err
    assert snapshot(tmp_path) == before, "check writes nothing"

    edit_spec(overlay, lambda d: d["storage"]["nfs"].update(server="10.20.0.5"))
    err = one_line_refusal(capsys, ["k8s", "check", str(overlay)])
    assert "images.server registry.invalid/grpo-deploy/vllm" in err and "placeholder registry" in err

    def own_registry(d):
        d["images"]["server"] = "grpo-deploy/vllm:0.1.0-cu130-arm64"  # no registry at all
        d["images"]["trainer"] = "registry.lab.internal:5000/grpo-deploy/trainer:0.1.0-cu130-arm64"
    edit_spec(overlay, own_registry)
    err = one_line_refusal(capsys, ["k8s", "check", str(overlay)])
    assert "images.server grpo-deploy/vllm:0.1.0-cu130-arm64 names no registry" in err

    qualified = "registry.lab.internal:5000/grpo-deploy/vllm:0.1.0-cu130-arm64"
    edit_spec(overlay, lambda d: d["images"].update(server=qualified))
    err = one_line_refusal(capsys, ["k8s", "check", str(overlay)])
    assert "generated/ differs from a render of spec.yaml" in err and "grpo-deploy k8s render" in err

    assert cli.main(["k8s", "render", str(overlay)]) == 0
    secret = "kubectl -n gb10-trl-async create secret generic grpo-run-token --from-file=token=/dev/stdin"
    assert secret in capsys.readouterr().out, "render says the run's token Secret is required"
    assert "nfs_server=10.20.0.5" in (overlay / "generated" / "params.env").read_text()
    assert "server: 10.20.0.5" in (overlay / "generated" / "admin" / "shared-pv.yaml").read_text()
    assert cli.main(["k8s", "check", str(overlay)]) == 0
    out = capsys.readouterr().out
    assert "ready" in out and "required once" in out and secret in out


def test_verl_overlays_need_no_token_secret():
    """verl's vLLM is colocated in the trainer's processes and publishes nothing: no front, no token."""
    assert k8s_overlay.secret_lines(K8S / "a100") == [] and k8s_overlay.secret_lines(K8S / "a100-rayjob") == []


def test_check_refuses_replicas_the_overlays_cannot_run(tmp_path, capsys):
    overlay = copy_overlay(tmp_path, "h200")
    def two_replicas(d):
        d["hosts"][0]["roles"] = ["trainer"]
        d["hosts"].append({"name": "s", "address": "10.0.0.2", "profile": "h200", "roles": ["server"], "replicas": 2})
    edit_spec(overlay, two_replicas)
    err = one_line_refusal(capsys, ["k8s", "check", str(overlay)])
    assert "several vLLM server replicas" in err and "run one server and no replica proxy yet" in err


def test_check_refuses_a_trainer_of_several_processes(tmp_path, capsys):
    """The trainer pod gets one GPU: two processes would leave rank 1 without one."""
    overlay = copy_overlay(tmp_path, "h200")

    def two_processes(d):
        d["hosts"][0]["roles"] = ["trainer"]
        d["hosts"].append({"name": "s", "address": "10.0.0.2", "profile": "h200", "roles": ["server"]})
        d.setdefault("overrides", {}).setdefault("runtime", {})["trainer_processes"] = 2
    edit_spec(overlay, two_processes)
    err = one_line_refusal(capsys, ["k8s", "check", str(overlay)])
    assert "trainer_processes is 2" in err and "trainer pod one GPU" in err


def test_check_refuses_a_trainer_across_hosts(tmp_path, capsys):
    """The overlays run one trainer pod: a second trainer host would be dropped without a word."""
    overlay = copy_overlay(tmp_path, "h200")

    def two_trainer_hosts(d):
        d["hosts"][0]["roles"] = ["trainer"]
        d["hosts"].append({"name": "t2", "address": "10.0.0.3", "profile": "h200", "roles": ["trainer"]})
        d["hosts"].append({"name": "s", "address": "10.0.0.2", "profile": "h200", "roles": ["server"]})
    edit_spec(overlay, two_trainer_hosts)
    err = one_line_refusal(capsys, ["k8s", "check", str(overlay)])
    assert "2 hosts with role trainer" in err and "one trainer pod" in err


def test_check_says_the_ci_overlay_is_not_for_users(tmp_path, capsys):
    err = one_line_refusal(capsys, ["k8s", "check", str(copy_overlay(tmp_path, "cpu"))])
    assert "CI-only overlay" in err


def test_render_keeps_what_the_kit_did_not_write(tmp_path, capsys):
    overlay = copy_overlay(tmp_path, "h200")
    edit_spec(overlay, lambda d: d["storage"]["nfs"].update(server="10.20.0.5"))
    (overlay / "generated" / "notes.txt").write_text("mine\n")
    assert cli.main(["k8s", "render", str(overlay)]) == 0
    assert (overlay / "generated" / "notes.txt").read_text() == "mine\n"
    (tmp_path / "elsewhere").write_text("not the kit's\n")
    (overlay / "generated" / "params.env").unlink()
    (overlay / "generated" / "params.env").symlink_to(tmp_path / "elsewhere")
    capsys.readouterr()
    before = snapshot(overlay)
    err = one_line_refusal(capsys, ["k8s", "render", str(overlay)])
    assert "symbolic link" in err
    assert snapshot(overlay) == before and (tmp_path / "elsewhere").read_text() == "not the kit's\n"


@pytest.mark.parametrize("arg", ["k8s/h200\n", "k8s/h200\nextra", "$HOME", "..", "../..", "-x", "--", "k8s/h200/..",
                                 "k8s/h200/spec.yaml", "/", "k8s/base", "\x00"])
@pytest.mark.parametrize("verb", ["check", "render"])
def test_hostile_overlay_arguments(verb, arg, tmp_path, capsys, monkeypatch):
    shutil.copytree(K8S, tmp_path / "k8s")
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    with pytest.raises(SystemExit) as exc:  # argparse refusals exit through SystemExit
        raise SystemExit(cli.main(["k8s", verb, arg]))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert snapshot(tmp_path) == before, "nothing written"


def test_hostile_nfs_server_in_the_spec_is_refused_before_anything_is_written(tmp_path, capsys):
    overlay = copy_overlay(tmp_path, "h200")
    for bad in ["$(reboot)", "nfs\nserver", "-oProxyCommand=x", "a b", "../etc"]:
        edit_spec(overlay, lambda d, bad=bad: d["storage"]["nfs"].update(server=bad))
        before = snapshot(overlay)
        assert cli.main(["k8s", "render", str(overlay)]) == 2
        err = capsys.readouterr().err
        assert "storage.nfs.server" in err and "Traceback" not in err, err
        assert snapshot(overlay) == before
