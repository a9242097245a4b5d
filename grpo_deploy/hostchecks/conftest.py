"""The host checks' pytest glue: the --spec / --run-checks options (unless grpo_deploy.hostchecks.plugin holds them),
the spec loaded and resolved once, each testinfra host mapped to the spec host it is, paramiko hosts connected with
their host keys verified, every report labelled with the spec host's name, run checks left out without
--run-checks. Without --hosts, every host of the spec is checked."""

from __future__ import annotations

import pytest

from grpo_deploy.hostchecks import plugin
from grpo_deploy.hostchecks.targets import InfraHost, hostspecs, spec_host_of

RES = pytest.StashKey()
SSH = pytest.StashKey()  # testinfra backend -> (the kit's verified SSH connection, or the HostError it raised)
RUN_MODULE = "grpo_deploy.hostchecks.test_run"


def pytest_addoption(parser, pluginmanager):
    if not pluginmanager.is_registered(plugin):
        plugin.add_options(parser)


def resolved(config):
    """The spec from --spec, loaded and resolved once per session; an invalid or missing one stops the session."""
    if RES not in config.stash:
        from grpo_deploy.spec.load import load
        from grpo_deploy.spec.resolve import resolve
        from grpo_deploy.spec.schema import SpecError

        path = config.getoption("spec")
        try:
            config.stash[RES] = resolve(load(path))
        except SpecError as exc:
            raise pytest.UsageError(f"--spec {path}: the spec is not valid; no host was checked:\n  "
                                    + "\n  ".join(str(p) for p in exc.problems)) from None
    return config.stash[RES]


def pytest_configure(config):
    option = config.option
    if hasattr(option, "hosts") and option.hosts is None and not getattr(option, "ansible_inventory", None):
        option.hosts = ",".join(hostspecs(resolved(config)))
    config.stash[SSH] = {}


def pytest_collection_modifyitems(config, items):
    if config.getoption("run_checks"):
        return
    left_out = [i for i in items if getattr(i, "module", None) is not None and i.module.__name__ == RUN_MODULE]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [i for i in items if i not in left_out]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if not any(key == "host" for key, _ in report.user_properties):
        infra = getattr(item, "callspec", None) and item.callspec.params.get("_testinfra_host")
        if infra is not None:
            found = spec_host_of(resolved(item.config), infra)
            report.user_properties.append(("host", found.name if found else infra.backend.get_pytest_id()))
    return report


def pytest_sessionfinish(session):
    for backend, conn in session.config.stash.get(SSH, {}).items():
        if not isinstance(conn, Exception):
            backend.__dict__.pop("client", None)  # testinfra caches hosts across sessions: never keep a closed client
            conn.close()
    session.config.stash[SSH] = {}


def verified(config, infra, spec_host) -> None:
    """A paramiko host gets the kit's SSH connection (ssh_config honoured, host key checked against known_hosts,
    unknown keys refused unless --accept-new-host-keys); testinfra's own paramiko client accepts any key."""
    backend = infra.backend
    if backend.NAME != "paramiko" or ("client" in vars(backend) and backend not in config.stash[SSH]):
        return
    from grpo_deploy.hosts.connect import HostError, SshHost, SshOptions

    known = config.stash[SSH]
    if backend not in known:
        t = backend.host
        name = f"[{t.name}]" if ":" in t.name else t.name
        address = f"{t.user + '@' if t.user else ''}{name}{':' + str(t.port) if t.port else ''}"
        conn = SshHost(spec_host.name, address, SshOptions(config.option.ssh_config,
                                                           config.getoption("accept_new_host_keys")))
        try:
            conn.connect()
            backend.__dict__["client"] = conn._client
            known[backend] = conn
        except HostError as exc:
            known[backend] = exc
    if isinstance(known[backend], HostError):
        exc = known[backend]
        pytest.fail(f"{spec_host.name}: {exc.what}" + (f" -> {exc.fix}" if exc.fix else ""), pytrace=False)


@pytest.fixture(scope="session")
def res(pytestconfig):
    """The resolved spec: every expected value comes from here."""
    return resolved(pytestconfig)


@pytest.fixture(scope="module")
def spec_host(host, res, pytestconfig):
    """The spec host (hosts[]) that the testinfra host of this test is."""
    found = spec_host_of(res, host)
    if found is None:
        pytest.fail(f"{host.backend.get_pytest_id()} is not a host of the spec {pytestconfig.getoption('spec')} "
                    f"(its hosts: {', '.join(f'{h.name}={h.address}' for h in res.spec.hosts)}) -> pass --hosts "
                    f"with their addresses ({','.join(hostspecs(res))}) or leave --hosts out", pytrace=False)
    verified(pytestconfig, host, found)
    return found


@pytest.fixture(scope="module")
def conn(host, spec_host):
    """The testinfra host through the kit's connector interface (grpo_deploy.hosts.facts reads through it)."""
    return InfraHost(spec_host.name, spec_host.address, host)


@pytest.fixture(scope="session")
def given_hosts(res, pytestconfig):
    """{spec host name: testinfra host} for every --hosts entry that is a spec host (testinfra's own host objects)."""
    import testinfra

    o = pytestconfig.option
    hosts = testinfra.get_hosts(o.hosts.split(",") if o.hosts else [None], connection=o.connection,
                                ssh_config=o.ssh_config, ssh_identity_file=o.ssh_identity_file, sudo=o.sudo,
                                sudo_user=o.sudo_user, ansible_inventory=o.ansible_inventory,
                                force_ansible=o.force_ansible)
    out = {}
    for infra in hosts:
        found = spec_host_of(res, infra)
        if found is not None:
            out.setdefault(found.name, infra)
    return out


@pytest.fixture
def on_host(request, given_hosts, pytestconfig):
    """on_host(spec_host, label=None) -> its connector, for checks that pick hosts by role; labels the report with
    *label* (default the host's name). Skips when that host is not among --hosts."""
    def get(spec_host, label: str | None = None) -> InfraHost:
        if not any(key == "host" for key, _ in request.node.user_properties):
            request.node.user_properties.append(("host", label or spec_host.name))
        infra = given_hosts.get(spec_host.name)
        if infra is None:
            pytest.skip(f"{spec_host.name} ({spec_host.address}) is not among the hosts given with --hosts")
        verified(pytestconfig, infra, spec_host)
        return InfraHost(spec_host.name, spec_host.address, infra)

    return get
