"""grpo_deploy.hosts.ship without a Docker engine: the kept archive of an image streamed without the layers a host
already has (seeked past, not read), every other member as it was."""

from __future__ import annotations

import io
import tarfile

from grpo_deploy.hosts import ship


def archive_with(path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_the_kept_archive_is_sent_without_the_skipped_layers(tmp_path):
    members = {"a1/layer.tar": b"A" * 5000, "b2/layer.tar": b"B" * 300, "manifest.json": b"[]", "c3.json": b"{}"}
    archive_with(tmp_path / "img.tar", members)
    seen = []
    data = b"".join(ship._filtered_save("img:1", {"a1/layer.tar"}, seen.append, archive=tmp_path / "img.tar"))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar}
    assert got == {k: v for k, v in members.items() if k != "a1/layer.tar"}
    assert seen[-1] == len(data)
    everything = b"".join(ship._filtered_save("img:1", set(), seen.append, archive=tmp_path / "img.tar"))
    with tarfile.open(fileobj=io.BytesIO(everything)) as tar:
        assert {m.name for m in tar} == set(members)
    none = b"".join(ship._filtered_save("img:1", None, seen.append, archive=tmp_path / "img.tar"))
    with tarfile.open(fileobj=io.BytesIO(none)) as tar:
        assert {m.name for m in tar} == {"manifest.json", "c3.json"}
