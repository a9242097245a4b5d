"""Tests of grpo_deploy.engines: which image each engine's roles run, answered in one place; what an engine does not
support yet, said in the engine's words; and a third engine, registered only here, that renders, plans and passes
preflight's spec-level checks with no edit elsewhere in the kit."""

import dataclasses
import re

import pytest

from grpo_deploy import engines, plan, preflight, render, spec
from grpo_deploy.cli import main
from grpo_deploy.engines import TRL_ASYNC, VERL
from grpo_deploy.engines.base import Engine, Unsupported
from grpo_deploy.spec import new_spec, profiles, resolve
from tests.specs import spec_yaml

# ---------------------------------------------------------------- a third engine, registered only here

class Toy(Engine):
    """One role that trains alone: what a new engine module holds, and nothing else in the kit is edited."""

    def config_files(self, res, publish_ips=None):
        return {"config/toy.txt": f"model={res.settings.model.path}\nsteps={self.total_steps(res)}\n"}

    def host_files(self, res, host, config_dir, publish_ips=None):
        return {f"hosts/{host.name}.env": f"GRPO_RUN={res.spec.run.name}\nGRPO_TOY_IMAGE={res.images['trainer']}\n"}

    def k8s_params(self, res):
        return {"toy_steps": self.total_steps(res)}

    def memory(self, res, arch, host, role, cap):
        return {"role": role, "estimate_gb": round(arch.params() * 2 / 1e9, 2), "fits": True, "why": "toy"}

    def total_steps(self, res):
        return 12


TOY = Toy(name="toy", description="a single-role engine known only to this test", roles=("trainer",),
          main_role="trainer", role_images={"trainer": "trainer"}, role_counts={"trainer": (1, 1)},
          sections=("model", "lora", "data", "checkpoints"), checkpoint_layout="toy", reader_role="trainer",
          single_host_roles=("trainer",), multi_host_roles=(("trainer",), ("trainer",)),
          unsupported={"up": "the toy engine cannot start a run: it exists only in a test",
                       "several trainer hosts": "the toy engine trains on one host"})
TOY_SPEC = ("engine: toy\nhosts: [{name: box, profile: cpu, roles: [trainer]}]\n"
            "checkpoints: {save_every: 4, keep: 2}\n")


@pytest.fixture
def toy(monkeypatch):
    """TOY in the registry and a cpu profile that lists it, for this test only."""
    cpu = profiles.load("cpu")
    toy_cpu = dataclasses.replace(cpu, engines=cpu.engines + ("toy",))
    real_load = profiles.load
    monkeypatch.setattr(profiles, "load", lambda name: toy_cpu if name == "cpu" else real_load(name))
    monkeypatch.setitem(engines.ENGINES, TOY.name, TOY)
    return lambda text=TOY_SPEC: resolve.resolve(spec.loads(text, source="toy.yaml"), load_profile=profiles.load)


def test_a_third_engine_registered_in_a_test_renders(toy):
    files = render.render_files(toy())
    assert files["config/toy.txt"] == "model=/opt/grpo-deploy/models/tiny-qwen2\nsteps=12\n"
    assert files["hosts/box.env"].startswith("GRPO_RUN=rehearsal\nGRPO_TOY_IMAGE=grpo-deploy/cpu:")
    assert "toy_steps=12\n" in files["k8s/params.env"] and "server_port" not in files["k8s/params.env"]
    assert not any(name.startswith("config/server") or name.endswith(".gpu.yaml") for name in files)


def test_a_third_engine_plans_with_its_own_steps_memory_and_checkpoints(toy):
    p = plan.make_plan(toy(), free_bytes=10**12)
    assert p.engine == "toy" and p.hosts[0].memory[0]["why"] == "toy" and p.hosts[0].gpus == "none"
    assert p.disk.total_steps == 12 and p.disk.save_steps == [4, 8, 12] and p.disk.adapters_kept == 0
    assert p.disk.explanation[0].startswith("toy checkpoint = LoRA") and p.disk.fits


def test_a_third_engine_passes_preflight_spec_level_checks(toy):
    ctx = preflight.Context(toy(), free_space={"box": 10**12})
    try:
        results = preflight.run_checks(ctx, only=["spec", "logger", "identity", "disk"])
    finally:
        ctx.close()
    assert [r.verdict for r in results] == ["ok"] * 4, results
    assert results[0].fact.startswith("toy on box(trainer)")


def test_the_door_knows_a_registered_engine_and_its_limits(toy):
    twice = TOY_SPEC.replace("roles: [trainer]}]", "address: a, roles: [trainer]}, "
                             "{name: two, address: b, profile: cpu, roles: [trainer]}]")
    with pytest.raises(spec.SpecError) as info:
        toy(twice.replace("checkpoints:", "storage: {nfs: {server: n, export: /x}}\ncheckpoints:"))
    assert [p.message for p in info.value.problems] == ["the toy engine trains on one host"]
    with pytest.raises(spec.SpecError) as info:
        toy(TOY_SPEC.replace("roles: [trainer]", "roles: [server]"))
    assert "'server' is not a toy role; allowed: trainer" in info.value.problems[0].message


def test_an_unsupported_feature_answers_with_the_engine_reason(toy):
    res = toy()
    with pytest.raises(Unsupported, match="^the toy engine cannot start a run: it exists only in a test$"):
        res.engine_info.refuse("up")
    assert res.engine_info.why_not("diagnose") is None
    assert VERL.why_not("up") is None  # verl launches (grpo_deploy.deploy.bringup.verl)
    assert TRL_ASYNC.role_limit_why("server") is None  # replicas go behind the kit's proxy
    assert TRL_ASYNC.role_limit_why("trainer") is None  # one process group over the trainer hosts


def test_diagnose_on_verl_is_the_verl_engine_s_own(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "verl.yaml"
    path.write_text(new_spec.spec_text("a100", "verl", []))
    assert main(["diagnose", "-f", str(path)]) != 0  # no run yet: nothing to read
    out = capsys.readouterr().out
    assert "diagnosis: not enough data" in out and "Traceback" not in out
    assert VERL.why_not("diagnose") is None


def test_all_roles_are_the_engines_roles_each_once():
    assert engines.ALL_ROLES == ("server", "trainer", "head", "worker")
    assert engines.DEFAULT_ENGINE in engines.ENGINES




def test_a_cluster_key_where_no_cluster_spans_hosts_is_refused_not_ignored():

    cases = [(("gb10", "trl-async", ("s1", "s2")), "hosts.1.interface", "eth0", "hosts[1].interface"),
             (("cpu", "verl", ()), "hosts.0.infiniband", True, "hosts[0].infiniband")]
    for args, key, value, named in cases:
        with pytest.raises(spec.SpecError, match=rf"{re.escape(named)}: only a cluster across hosts uses it and this "
                                                 rf"spec makes none .*remove {re.escape(named)}"):
            spec.loads(spec_yaml(*args, **{key: value}), source="s.yaml")
    two = spec_yaml("a100", "verl", ("n1", "n2"), **{"hosts.1.interface": "ib0", "hosts.1.infiniband": True})
    assert resolve.resolve(spec.loads(two, source="s.yaml")).spec.hosts[1].interface == "ib0"
