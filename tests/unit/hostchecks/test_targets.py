"""Tests of grpo_deploy.hostchecks.targets: testinfra host specs from the spec's addresses, and the spec host a
testinfra host is."""

from __future__ import annotations

import testinfra

from grpo_deploy import spec
from grpo_deploy.hostchecks.targets import hostspec, hostspecs, spec_host_of
from grpo_deploy.spec import new_spec, resolve


def test_hostspecs_from_addresses():
    assert hostspec("local") == "local://"
    assert hostspec("spark1") == "paramiko://spark1"
    assert hostspec("deploy@10.0.0.2:2222") == "paramiko://deploy@10.0.0.2:2222"
    assert hostspec("fe80::1") == "paramiko://[fe80::1]"
    res = resolve.resolve(spec.loads(new_spec.spec_text("cpu", "trl-async", ["spark1", "deploy@10.0.0.9:2222"])))
    assert hostspecs(res) == ["paramiko://spark1", "paramiko://deploy@10.0.0.9:2222"]


def test_a_testinfra_host_maps_to_the_spec_host_it_is():
    res = resolve.resolve(spec.loads(new_spec.spec_text("cpu", "trl-async", ["spark1", "deploy@10.0.0.9:2222"])))
    names = {s: getattr(spec_host_of(res, testinfra.get_host(s)), "name", None)
             for s in ("paramiko://spark1", "paramiko://10.0.0.9", "paramiko://deploy@10.0.0.9:2222",
                       "paramiko://10.0.0.9:22", "paramiko://other", "local://")}
    second = res.spec.hosts[1].name
    assert names == {"paramiko://spark1": "spark1", "paramiko://10.0.0.9": second,
                     "paramiko://deploy@10.0.0.9:2222": second, "paramiko://10.0.0.9:22": None,
                     "paramiko://other": None, "local://": None}
