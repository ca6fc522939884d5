"""Make the forkserver that local CPU ranks are forked from die with its launcher.

launch.start_method forks each CPU rank from one server process. A rank dies with its parent
(utils.die_with_parent), but its parent is that server, not the launcher, and the server
outlived a launcher ended by SIGKILL: the ranks trained on and wrote `completed` into a run
directory that a rerun was already taking over (issue 56). The launcher preloads this module
into the server (launch.RANK_MODULES). Here the server asks the kernel for PARENT_DIED when the
launcher dies, whatever killed it; on it the server removes its pymp-* folder (its listener
socket, which nobody else would remove) and exits, and the ranks, asking the same of the
server, die with it.

It acts only in the process the launcher named (FORKSERVER_OF holds the launcher's pid, which is
the server's parent), so importing it anywhere else does nothing.
"""

from __future__ import annotations

import os
import shutil
import signal

from accordion_repro.utils import die_with_parent

PARENT_DIED = signal.SIGRTMIN + 3  # a signal nothing else here uses
FORKSERVER_OF = "ACCORDION_FORKSERVER_OF"    # the launcher's pid
FORKSERVER_DIR = "ACCORDION_FORKSERVER_DIR"  # the launcher's multiprocessing temp dir (pymp-*)


def _leave(signum=None, frame=None) -> None:
    directory = os.environ.get(FORKSERVER_DIR)
    if directory and os.path.basename(directory).startswith("pymp-"):
        shutil.rmtree(directory, ignore_errors=True)
    os._exit(0)


def _guard() -> None:
    launcher = os.environ.get(FORKSERVER_OF, "")
    if not launcher.isdigit() or os.getppid() != int(launcher):
        return
    signal.signal(PARENT_DIED, _leave)
    die_with_parent(PARENT_DIED, parent_pid=int(launcher))


_guard()
