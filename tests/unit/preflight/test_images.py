"""Tests of grpo_deploy.preflight.images: the images every host needs (each of its roles' images once, with the tag
the spec resolves)."""

from grpo_deploy import spec
from grpo_deploy.preflight import images
from grpo_deploy.spec import resolve
from tests.specs import spec_yaml


def _needed(*args):
    res = resolve.resolve(spec.loads(spec_yaml(*args), source="s.yaml"))
    return res, [(host.name, key, tag) for host, key, tag in images.images_needed(res)]


def test_one_trl_host_needs_the_server_and_the_trainer_image():
    res, needed = _needed("cpu", "trl-async", ())
    host = res.spec.hosts[0].name
    assert sorted(needed) == sorted([(host, "server", res.images["server"]), (host, "trainer", res.images["trainer"])])


def test_verl_hosts_each_need_the_one_verl_image():
    res, needed = _needed("a100", "verl", ("n1", "n2"))
    assert needed == [("n1", "verl", res.images["verl"]), ("n2", "verl", res.images["verl"])]
