"""grpo_deploy.hosts.docker_api: the one client factory and its timeout policy, against a stand-in engine the real
Docker SDK talks to (tests/engine_standin.py): a query is retried once, a POST never, work waits longer, and a build
whose post-build calls time out still yields the image it built."""

from __future__ import annotations

import ast
import io
from pathlib import Path

import pytest
import requests

from grpo_deploy.hosts import docker_api
from grpo_deploy.image_build import build
from grpo_deploy.image_build.progress import Step
from tests.engine_standin import IMAGE_ID, StandInEngine

ROOT = Path(__file__).resolve().parents[3]


def test_a_query_that_times_out_once_is_sent_again_and_answered(tmp_path):
    with StandInEngine(tmp_path, stall={"GET /images/json": 3}, stall_times=1) as standin:
        client = docker_api.client(standin.url, timeout=1)
        assert client.images.list() == []
    assert standin.calls["GET /images/json"] == 2, "one retry after the read timeout"


def test_a_query_that_never_answers_fails_after_its_one_retry(tmp_path):
    with StandInEngine(tmp_path, stall={"GET /images/json": 3}) as standin:
        client = docker_api.client(standin.url, timeout=1)
        with pytest.raises(requests.exceptions.RequestException):
            client.images.list()
    assert standin.calls["GET /images/json"] == 1 + docker_api.QUERY_RETRIES


def test_a_post_is_never_sent_twice(tmp_path):
    with StandInEngine(tmp_path, stall={"POST /images/prune": 3}) as standin:
        client = docker_api.client(standin.url, timeout=1)
        with pytest.raises(requests.exceptions.RequestException):
            client.images.prune()
    assert standin.calls["POST /images/prune"] == 1, "a POST may have acted: it is not repeated"


def test_work_goes_through_a_client_that_waits_longer(tmp_path, monkeypatch):
    monkeypatch.setattr(docker_api, "WORK_TIMEOUT_S", 5)
    with StandInEngine(tmp_path, stall={"POST /images/prune": 2}) as standin:
        client = docker_api.client(standin.url, timeout=1)
        work = docker_api.for_work(client)
        assert (client.api.timeout, work.api.timeout) == (1, 5)
        assert docker_api.for_work(client) is work, "made once per client"
        assert work.images.prune()["SpaceReclaimed"] == 0, "2 s of work: past the query timeout, within the work one"


def test_the_default_policy():
    assert docker_api.QUERY_TIMEOUT_S >= 60 > 10, "10 s (the SDK's default) failed a finished build on a busy engine"
    assert docker_api.WORK_TIMEOUT_S >= 15 * 60


def test_no_engine_is_one_line(tmp_path):
    with pytest.raises(docker_api.DockerUnavailable) as caught:
        docker_api.client(f"unix://{tmp_path}/missing.sock", timeout=1)
    assert "\n" not in str(caught.value) and str(caught.value)


def test_a_build_whose_post_build_calls_time_out_still_yields_the_image_it_built(tmp_path, monkeypatch):
    """The fresh machine's failure (issue 17): the build stream ended with the image's id, then the engine, still
    committing a 4.3 GB layer, left the calls after it unanswered past the client's timeout. The build must succeed,
    look the image up and say what it skipped."""
    monkeypatch.setattr(docker_api, "WORK_TIMEOUT_S", 1)
    tag = "grpo-deploy/cpu-deps:0123456789ab-amd64"
    stalls = {"GET /images/json": 3, f"GET /images/{IMAGE_ID}/json": 3}  # listing old deps, reading the new one
    with StandInEngine(tmp_path, stall=stalls, stall_times=2, tags=[tag]) as standin:
        client = docker_api.client(standin.url, timeout=1)
        err = io.StringIO()
        with Step("dependency image", tmp_path / "build.log", out=err) as step:
            image_id = build.docker_build(client, [build.Member("Dockerfile", b"FROM scratch\n")], step, tag=tag)
            summary = build.tidy_after_deps(client, tag, image_id, step)
            step.done(f"built {tag} ({summary})")
    assert image_id == IMAGE_ID
    assert standin.calls["GET /images/json"] == 2, "the listing timed out twice (its retry included)"
    assert summary == "size not read", "reading the new image timed out twice too"
    assert standin.calls[f"GET /images/{IMAGE_ID}/json"] == 2
    log = (tmp_path / "build.log").read_text()
    assert "note: untagging older dependency images did not complete" in log
    assert "note: reading the new image did not complete" in log
    assert "FAILED" not in err.getvalue() and "built grpo-deploy/cpu-deps" in err.getvalue()


def test_housekeeping_returns_the_default_and_logs_the_problem():
    lines = []

    def slow():
        raise requests.exceptions.ReadTimeout("Read timed out. (read timeout=10)")

    assert docker_api.housekeeping("pruning", slow, lines.append, default=[]) == []
    assert len(lines) == 1 and "pruning did not complete (ReadTimeout" in lines[0]
    assert docker_api.housekeeping("reading", lambda: 42, lines.append) == 42 and len(lines) == 1


# ------------------------------------------------------------------ one factory for the product and the tests

CLIENT_MAKERS = {"from_env", "DockerClient", "APIClient"}
FACTORY = ROOT / "grpo_deploy" / "hosts" / "docker_api.py"
STANDIN_TESTS = ROOT / "tests" / "unit"  # clients of stand-in sockets (test_supervise, this file), never of an engine


def client_constructions(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(), str(path))
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name in CLIENT_MAKERS:
                lines.append(node.lineno)
    return lines


def test_the_product_the_fixtures_and_the_benchmarks_make_clients_only_through_the_factory():
    found = {}
    for folder in ("grpo_deploy", "tests", "benchmarks", "scripts"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == FACTORY or STANDIN_TESTS in path.parents:
                continue
            if lines := client_constructions(path):
                found[str(path.relative_to(ROOT))] = lines
    assert found == {}, f"Docker clients made outside grpo_deploy/hosts/docker_api.py: {found}"
    assert client_constructions(FACTORY), "the factory itself makes them"


def test_the_session_fixture_is_the_factorys_client():
    import tests.conftest as root

    source = ast.unparse(next(n for n in ast.parse(Path(root.__file__).read_text()).body
                              if isinstance(n, ast.FunctionDef) and n.name == "docker_client"))
    assert "docker_api.client()" in source


def test_a_slow_first_answer_after_a_build_is_ridden_out_by_the_retry(tmp_path, monkeypatch):
    monkeypatch.setattr(docker_api, "WORK_TIMEOUT_S", 1)
    tag = "grpo-deploy/cpu-deps:0123456789ab-amd64"
    with StandInEngine(tmp_path, stall={f"GET /images/{IMAGE_ID}/json": 3}, stall_times=1, tags=[tag]) as standin:
        client = docker_api.client(standin.url, timeout=1)
        with Step("dependency image", tmp_path / "build.log", out=io.StringIO()) as step:
            summary = build.tidy_after_deps(client, tag, IMAGE_ID, step)
    assert summary == "4.3 GB" and standin.calls[f"GET /images/{IMAGE_ID}/json"] == 2
