"""testinfra health checks a user runs against the real hosts of a deployment spec. This package owns the checks
(test_host.py: host checks, one per function, parametrized over the hosts testinfra is given; test_run.py: checks of
a running run, only with --run-checks), their pytest glue (conftest.py: spec loading, testinfra host -> spec host,
verified SSH; plugin.py: the options), and `grpo-deploy check` (runner.py). Every expected value — run UID/GID,
hosts[].shared_dir, storage.nfs, profiles, images, the served model and port, the run and adapter directories, the
disk need from plan — is read from the spec, never restated in a check.

Two ways to run them:

    grpo-deploy check -f grpo-deploy.yaml --ssh-config ~/.ssh/config [--run] [-- extra pytest args, e.g. -k shared_dir]

builds --hosts from the spec (paramiko://<address>, local:// for address 'local'), prints one line per check per host
(PASS / FAIL with the message / SKIP with the reason) and exits 0 when every check passed, 1 when one failed, 2 when
the checks could not run (invalid spec; pytest or pytest-testinfra missing: pip install 'grpo-deploy[check]').

    pytest -p grpo_deploy.hostchecks.plugin --pyargs grpo_deploy.hostchecks \\
        --hosts=paramiko://spark1,paramiko://spark2 --ssh-config=~/.ssh/config --spec=grpo-deploy.yaml [--run-checks]

is the same run with pytest's own output. `-p grpo_deploy.hostchecks.plugin` is needed with --pyargs: pytest takes
command-line options only from plugins and from the conftest of a path on its command line, and a --pyargs name is
not a path. Without it, give the package's folder as the path (`pytest $(python -c 'import grpo_deploy.hostchecks as
m; print(m.__path__[0])') --spec=...`), or set GRPO_DEPLOY_SPEC (and GRPO_DEPLOY_RUN_CHECKS=1) in the environment.
Without --hosts every host of the spec is checked. Paramiko hosts are reached the way the deployer reaches them: the
ssh config's aliases, users, ports and keys, host keys verified against known_hosts (--accept-new-host-keys to save
an unknown one).
"""
