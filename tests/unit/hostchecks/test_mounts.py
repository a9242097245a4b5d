"""Tests of grpo_deploy.hostchecks.mounts: NFS mount options compared as the kernel shows them, the mounted source
against the spec's export, findmnt's JSON."""

from __future__ import annotations

import pytest

from grpo_deploy.hostchecks import mounts


@pytest.mark.parametrize(("wanted", "shown", "gaps"), [
    ("nfsvers=4.1,hard,lookupcache=positive", "rw,relatime,vers=4.1,rsize=1048576,wsize=1048576,hard,proto=tcp,"
     "lookupcache=pos,sec=sys", []),
    ("nfsvers=4,hard,_netdev,x-systemd.automount,rsize=1048576", "rw,vers=4.2,hard,rsize=524288", []),
    ("nfsvers=4.1,hard,lookupcache=positive", "rw,vers=4.2,soft,proto=tcp",
     ["nfsvers=4.1 (mounted with vers=4.2)", "hard (not set)", "lookupcache=positive (not set)"]),
    ("nfsvers=3,proto=tcp,rsize=65536", "rw,vers=3,proto=udp,rsize=1048576",
     ["proto=tcp (mounted with proto=udp)", "rsize=65536 (mounted with rsize=1048576)"]),
])
def test_nfs_options_compared_as_the_kernel_shows_them(wanted, shown, gaps):
    assert mounts.option_gaps(wanted, shown) == gaps


def test_nfs_source_matches_the_export_by_name_or_address():
    assert mounts.same_export("nfs1:/srv/grpo/", "nfs1", "/srv/grpo")
    assert mounts.same_export("10.0.0.5:/srv/grpo", "nfs1", "/srv/grpo", {"10.0.0.5"})
    assert not mounts.same_export("nfs1:/srv/other", "nfs1", "/srv/grpo")
    assert not mounts.same_export("/dev/vda", "nfs1", "/srv/grpo")
    assert mounts.parse_findmnt('{"filesystems": [{"target": "/x", "fstype": "nfs4"}]}')["fstype"] == "nfs4"
    assert mounts.parse_findmnt("") is None
