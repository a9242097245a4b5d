"""A run's local folder and its locks: where the deployer keeps its events, the copies of the run's results and its
report (.grpo-deploy/<run>/), one `up` of a run at a time, and the error every step of `up` raises for the user."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from grpo_deploy.common.metrics import event_line, event_record, read_events
from grpo_deploy.kit_data import FOLDERS, KitDataMissing, kit_dir
from grpo_deploy.names import STATE_DIR
from grpo_deploy.runtime import run_token
from grpo_deploy.spec.resolve import Resolved

STATE_ROOT = Path(STATE_DIR)


class LaunchError(RuntimeError):
    """What stopped `up`, `down` or `logs`, in one line for the user (the CLI prints it and exits 2)."""


@dataclass
class RunState:
    """The deployer's local folder for one run: the render, its own events, and copies of the run's results."""

    res: Resolved
    root: Path = STATE_ROOT

    @property
    def dir(self) -> Path:
        return (self.root / self.res.spec.run.name).resolve()

    @property
    def render_dir(self) -> Path:
        return self.dir / "render"

    @property
    def deploy_log(self) -> Path:
        return self.dir / "deploy.jsonl"

    @property
    def metrics_copy(self) -> Path:
        return self.dir / "metrics.jsonl"

    def emit(self, event: str, **fields) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with self.deploy_log.open("a", encoding="utf-8") as f:
            f.write(event_line(event_record(event, **fields)) + "\n")

    def deploy_events(self) -> list[dict]:
        return read_events(str(self.deploy_log)) if self.deploy_log.exists() else []

    def saved_events(self) -> list[dict]:
        """The deployer's events plus the copy of the trainer's metrics `up` saved, limited to the latest `up` (the
        metrics file appends across resumes); read through the bounded reader (a link or a huge file raises
        ReadRefused, one line)."""
        copy = self.metrics_copy
        trainer = read_events(str(copy)) if os.path.lexists(copy) else []
        events = (read_events(str(self.deploy_log)) if os.path.lexists(self.deploy_log) else []) + trainer
        starts = [e["time"] for e in events if e["event"] == "up_start" and isinstance(e.get("time"), int | float)]
        return [e for e in events if isinstance(e.get("time"), int | float) and e["time"] >= starts[-1]] \
            if starts else events

    @property
    def token_file(self) -> Path:
        return self.dir / "run-token"

    def token(self) -> str:
        """The run's token (runtime/run_token.py): made at the run's first `up` and kept in a 0600 file here,
        so a restarted role, a second `up` resuming the run and `down` pass the same one. A file that is not one the
        kit wrote (a link, another form, readable by others) is replaced by a new token, said in one line without its
        content."""
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.token_file, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return self._new_token()
        except OSError:  # a link (ELOOP) or unreadable
            return self._new_token(replacing=True)
        try:
            info = os.fstat(fd)
            text = os.read(fd, 300).decode("ascii", "replace").strip()
        finally:
            os.close(fd)
        if info.st_mode & 0o077 or info.st_uid != os.getuid() or not run_token.well_formed(text):
            return self._new_token(replacing=True)
        return text

    def _new_token(self, replacing: bool = False) -> str:
        if replacing:
            print(f"warning: {self.token_file} was not the run's token as the kit writes it (a 0600 file of this user "
                  "holding one token): replaced by a new one", file=sys.stderr)
            self.token_file.unlink(missing_ok=True)
        token = run_token.make()
        fd = os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(token + "\n")
        return token

    @contextlib.contextmanager
    def up_lock(self) -> Iterator[None]:
        """One `up` of this run at a time on this machine: a second one — from this folder or any other of this user
        — is refused at once, naming the first (flocks: released by the kernel when the holder exits, however it
        exits). Runs of the same name started by another user or left up (`--keep`) from another folder are caught
        on the Docker engine (refuse_foreign_run)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        host_wide = Path(tempfile.gettempdir()) / f"grpo-deploy-{os.getuid()}"
        host_wide.mkdir(mode=0o700, exist_ok=True)
        with _flock(self.dir / "up.lock", f"run {self.res.spec.run.name} is already being started from this folder"), \
                _flock(host_wide / f"up-{self.res.spec.run.name}.lock",
                       f"run {self.res.spec.run.name} is already being started from another folder"):
            yield


@contextlib.contextmanager
def _flock(path: Path, busy: str) -> Iterator[None]:
    """Hold an exclusive flock on *path*, recording who holds it; LaunchError (busy + the holder) when taken."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 300, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise LaunchError(f"{busy} ({holder}): follow it with `grpo-deploy status --watch`, or stop it with "
                          "`grpo-deploy down`, then run up again") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"`grpo-deploy up` in {os.getcwd()}, pid {os.getpid()}, since "
                      f"{time.strftime('%H:%M:%S')}".encode(), 0)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def require_kit() -> dict[str, Path]:
    """The kit's compose/ and images/ folders (grpo_deploy.kit_data), checked before anything is started."""
    try:
        return {name: kit_dir(name) for name in FOLDERS}
    except KitDataMissing as exc:
        raise LaunchError(str(exc)) from None
