"""For a child process a test will Ctrl-C: SIGINT at its default in the child. A test session started in the background
(`... &`, nohup) hands its children SIGINT ignored, and a Python started so never raises KeyboardInterrupt — as a
user's terminal would not do. Pass `preexec_fn=sigint_default` to subprocess.Popen."""

from __future__ import annotations

import signal


def sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
