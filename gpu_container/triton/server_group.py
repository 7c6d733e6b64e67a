"""A local tritonserver ends whole: its Python-backend stubs and their shared memory go with it.

Each model instance runs in a stub process, tritonserver's child, whose only watch on its parent
is kill(parent, 0) every 300 ms, and that passes for a dead parent nobody has reaped (a zombie).
An edge whose tritonserver died on its own (the OOM killer, Triton's own abort) reaped it only at
its stop: until then the stub, reparented to init, kept the model's memory (76 MB for the demo
model) and its /dev/shm region. A stub that was itself killed leaves its region behind too, and
a SIGKILLed tritonserver removes none.

So a thread per server waits for tritonserver to exit, SIGKILLs its process group (it runs in a
session of its own; its stubs are in its group) while the unreaped server still holds the group's
id, so no other group can have taken it, removes the regions named with the server's own prefix
(`--backend-config=python,shm-region-prefix-name=`), and only then reaps it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import subprocess
import threading
from pathlib import Path

SHM_DIR = Path("/dev/shm")


class ServerGroup:
    """`process` (a session leader) and its process group, reaped by this object's thread alone."""

    def __init__(self, process: subprocess.Popen[bytes], shm_prefix: str) -> None:
        self.process = process
        self.shm_prefix = shm_prefix
        self._ended = threading.Event()
        threading.Thread(target=self._reap, name=f"tritonserver-{process.pid}-reaper", daemon=True).start()

    @property
    def alive(self) -> bool:
        """Not yet seen to exit (a caller's own Popen.wait() or poll() may have reaped it first)."""
        return not self._ended.is_set() and self.process.returncode is None

    def send_signal(self, sig: signal.Signals) -> None:
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, sig)

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the server has exited and its group and shared memory are gone."""
        return self._ended.wait(timeout)

    def _reap(self) -> None:
        pid = self.process.pid
        try:
            with contextlib.suppress(ChildProcessError):  # reaped already by a caller's wait()
                os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            # Unlinked while a dying stub may still map it: its memory goes with the last mapping.
            for region in SHM_DIR.glob(f"{glob.escape(self.shm_prefix)}*"):
                region.unlink(missing_ok=True)
        finally:
            self.process.wait()
            self._ended.set()
