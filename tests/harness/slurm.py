"""A real Slurm cluster on this machine for the tests (tests/test_slurm.py, test_multinode.py):
one node, or two across network namespaces. conftest.py turns it into the session fixtures
`slurm_cluster` and `slurm_two_nodes`."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from pathlib import Path

import pytest

from accordion_repro.utils import die_with_parent


# ---- a one-node Slurm cluster on this machine (tests/test_slurm.py) -------------------------
# Real slurmctld, slurmd and munged from Debian's slurm-wlm and munge packages, installed with
# apt when missing (root only), configured and run entirely from one temporary folder: its own
# slurm.conf, munge key and socket, state, spool and log folders, free ports. Nothing is written
# to /etc, /run or /var; every process it starts is stopped by the pid it recorded.
SLURM_PACKAGES = ("slurm-wlm", "munge")
SLURM_TOOLS = ("slurmctld", "slurmd", "munged", "munge", "sbatch", "srun", "scontrol", "squeue",
               "sinfo", "scancel")
# Where a Slurm or munge installation writes by default: the cluster must leave these as it
# found them (checked when it stops).
SLURM_SYSTEM_PATHS = ("/etc/slurm", "/etc/munge", "/run/munge", "/run/slurm", "/run/slurmctld.pid",
                      "/run/slurmd.pid", "/var/run/munge", "/var/spool/slurmd", "/var/spool/slurmctld",
                      "/var/spool/slurm", "/var/lib/munge", "/var/lib/slurm", "/var/log/munge",
                      "/var/log/slurm", "/var/log/slurmctld.log", "/var/log/slurmd.log")


# The daemons live in /usr/sbin, which a non-login PATH may lack.
SLURM_PATH = os.pathsep.join([os.environ.get("PATH", "/usr/bin:/bin"), "/usr/sbin", "/sbin"])


class SlurmUnavailable(RuntimeError):
    """The cluster cannot be installed or started here; the message says exactly why."""


def _tree_state(paths) -> dict:
    """path -> (size, mtime) of every file and folder under `paths` (missing ones absent)."""
    state = {}
    for top in map(Path, paths):
        if not top.exists() and not top.is_symlink():
            continue
        for path in [top, *(top.rglob("*") if top.is_dir() and not top.is_symlink() else [])]:
            try:
                st = path.lstat()
            except OSError:
                continue
            state[str(path)] = (st.st_size if not path.is_dir() else 0, st.st_mtime_ns)
    return state


def _proc_environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def _proc_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _all_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _proc_paths(pid: int) -> list[str]:
    """The working folder and open files of a process."""
    try:
        links = [f"/proc/{pid}/cwd", *(f"/proc/{pid}/fd/{fd}" for fd in os.listdir(f"/proc/{pid}/fd"))]
    except OSError:  # gone, or not ours to read
        return []
    paths = []
    for link in links:
        try:
            paths.append(os.readlink(link))
        except OSError:
            pass
    return paths


class SlurmCluster:
    """One slurmctld + one slurmd (node `localhost`, partition `debug`, CPUs and memory of
    this machine, two stand-in GPUs as GRES) + munged, all under `self.dir`."""

    NODE = "localhost"
    PARTITION = "debug"
    CRED_EXPIRE_S = 15  # a requeued job starts again this long (+1 s) after its requeue
    FAILED_STATES = frozenset({"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"})

    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.conf = self.dir / "slurm.conf"
        self.jobcomp = self.dir / "log" / "jobcomp.txt"
        self.socket = self.dir / "run" / "munge.socket"
        self.procs: dict[str, "subprocess.Popen"] = {}
        # Subprocesses that talk to this cluster (sbatch, srun, scontrol, the sweep) get this.
        self.env = {**os.environ, "SLURM_CONF": str(self.conf), "OMP_NUM_THREADS": "1",
                    "PATH": SLURM_PATH}
        for key in [k for k in self.env if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))]:
            if key != "SLURM_CONF":
                del self.env[key]
        self._system_before: dict = {}
        self._stopped = False

    # -- set-up -----------------------------------------------------------------------------
    @staticmethod
    def missing_tools() -> list[str]:
        import shutil

        return [tool for tool in SLURM_TOOLS if shutil.which(tool, path=SLURM_PATH) is None]

    @classmethod
    def install(cls) -> None:
        """apt-get install slurm-wlm munge when a tool is missing (root only)."""
        import subprocess

        if not cls.missing_tools():
            return
        if os.geteuid() != 0:
            raise SlurmUnavailable(f"{', '.join(cls.missing_tools())} not installed, and the tests "
                                   f"are not root, so they cannot `apt-get install -y "
                                   f"{' '.join(SLURM_PACKAGES)}`")
        import shutil

        if shutil.which("apt-get") is None:
            raise SlurmUnavailable(f"{', '.join(cls.missing_tools())} not installed and no apt-get "
                                   f"to install {' '.join(SLURM_PACKAGES)}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        log = []
        wait_for_lock = ["-o", "DPkg::Lock::Timeout=300"]  # another apt may be running
        for command in (["apt-get", *wait_for_lock, "update", "-qq"],
                        ["apt-get", *wait_for_lock, "install", "-y", "-qq", *SLURM_PACKAGES]):
            out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
            log.append(f"$ {' '.join(command)} -> {out.returncode}\n{out.stdout[-1500:]}{out.stderr[-1500:]}")
            if out.returncode != 0 and "install" in command:
                raise SlurmUnavailable("apt-get install failed:\n" + "\n".join(log))
        if cls.missing_tools():
            raise SlurmUnavailable(f"still missing after apt-get install: {cls.missing_tools()}")

    def _hardware(self) -> tuple[int, int]:
        """(CPUs, RealMemory MB) as slurmd itself sees this machine (`slurmd -C`)."""
        import re
        import subprocess

        out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=60,
                             env=self.env).stdout
        cpus = re.search(r"\bCPUs=(\d+)", out)
        mem = re.search(r"\bRealMemory=(\d+)", out)
        if not cpus or not mem:
            raise SlurmUnavailable(f"`slurmd -C` printed no CPUs/RealMemory: {out!r}")
        return int(cpus.group(1)), max(1, int(int(mem.group(1)) * 0.9))

    def write_config(self) -> None:
        from accordion_repro.launch import free_port

        for sub in ("munge", "run", "state", "spool", "log"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        # munged wants its socket folder reachable by all, its key folder private.
        for path in (self.dir, self.dir / "run"):
            path.chmod(0o755)
        (self.dir / "munge").chmod(0o700)
        key = self.dir / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        cpus, memory = self._hardware()
        self.cpus = cpus
        ctld_port = free_port()
        slurmd_port = free_port()
        while slurmd_port == ctld_port:
            slurmd_port = free_port()
        d = self.dir
        node_lines = "\n".join(
            f"NodeName={name} NodeAddr={addr} CPUs={cpus} RealMemory={memory} Gres=gpu:{gpus} "
            f"State=UNKNOWN" for name, addr, gpus in self.node_table())
        self.conf.write_text(f"""\
ClusterName=accordiontest
SlurmctldHost={self.controller_host()}
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
# cred_expire: a requeued job may start again only once the killed run's job credential has
# expired (slurmd refuses a revoked one: "Job credential revoked", and the job FAILS with no
# output). The default 120 s would make every requeue test wait two minutes.
AuthInfo=socket={self.socket},cred_expire={self.CRED_EXPIRE_S}
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd{self.PER_NODE}.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd{self.PER_NODE}.log
# no cgroups in a container: track processes by parentage, bind no CPUs
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
# no slurmdbd (so sacct has nothing); completed jobs are logged to a file instead
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={self.jobcomp}
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# A requeued job's BeginTime passing is no event that wakes the scheduler: the job then waited
# for the main loop's next periodic pass (every 60 s by default): 18 s past its BeginTime in each
# requeue measured here. A pass a second starts it within a second on this tiny cluster.
SchedulerParameters=sched_interval=1
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
# as many sites: a job is requeued only if it asks (--requeue)
JobRequeue=0
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=600
KillWait=5
Waittime=0
GresTypes=gpu
{node_lines}
PartitionName={self.PARTITION} Nodes={",".join(name for name, _, _ in self.node_table())} Default=YES MaxTime=INFINITE State=UP
""")
        # Stand-in GPUs: Slurm only counts them (SLURM_GPUS_ON_NODE); the runs use the CPU.
        (self.dir / "gres.conf").write_text("".join(
            f"NodeName={name} Name=gpu File={device}\n" for name, _, gpus in self.node_table()
            for device in ("/dev/null", "/dev/zero")[:gpus]))

    # one node here; TwoNodeSlurmCluster overrides these three
    PER_NODE = ""  # suffix of slurmd's pid and log files ("-%n": one per node)

    def controller_host(self) -> str:
        return self.NODE

    def node_table(self) -> list[tuple[str, str, int]]:
        """(name, address, stand-in GPUs) of each node."""
        return [(self.NODE, "127.0.0.1", 2)]

    def _start(self, name: str, command: list[str]) -> None:
        import subprocess

        log = open(self.dir / "log" / f"{name}.out", "wb")
        try:
            self.procs[name] = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**self.env, "ACCORDION_TEST_SLURM": str(self.dir)}, cwd=self.dir,
                start_new_session=True,
                preexec_fn=lambda: die_with_parent(signal.SIGTERM))  # dies with pytest
        finally:
            log.close()

    def _wait(self, what: str, predicate, timeout: float) -> None:
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise SlurmUnavailable(f"{name} exited with {proc.returncode} while waiting for "
                                           f"{what}:\n{self.log_tail(name)}")
            if predicate():
                return
            time.sleep(0.3)
        raise SlurmUnavailable(f"timed out after {timeout:.0f} s waiting for {what}:\n"
                               + "\n".join(self.log_tail(n) for n in self.procs))

    def log_tail(self, name: str, lines: int = 25) -> str:
        texts = []
        for path in (self.dir / "log" / f"{name}.out", self.dir / "log" / f"{name}.log"):
            if path.exists():
                texts.append(f"--- {path}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(texts)

    def start(self) -> "SlurmCluster":
        import subprocess

        self._system_before = _tree_state(SLURM_SYSTEM_PATHS)
        self.write_config()
        d = self.dir
        self._start("munged", ["munged", "--foreground", f"--key-file={d}/munge/munge.key",
                               f"--socket={self.socket}", f"--pid-file={d}/run/munged.pid",
                               f"--seed-file={d}/munge/munged.seed", f"--log-file={d}/log/munged.log"])

        def munge_works() -> bool:
            if not self.socket.exists():
                return False
            cred = subprocess.run(["munge", "-n", "-S", str(self.socket)], capture_output=True,
                                  timeout=30, env=self.env)
            return cred.returncode == 0 and subprocess.run(
                ["unmunge", "-S", str(self.socket)], input=cred.stdout, capture_output=True,
                timeout=30, env=self.env).returncode == 0

        self._wait("munged to answer on its socket", munge_works, 30)
        self._start("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self._start("slurmd", ["slurmd", "-D", "-N", self.NODE, "-f", str(self.conf)])

        def node_idle() -> bool:
            out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout.split()
            return out == [self.NODE, "idle"]

        self._wait(f"sinfo to show node {self.NODE} idle", node_idle, 90)
        return self

    # -- use --------------------------------------------------------------------------------
    def client(self, command: list[str]) -> list[str]:
        """A command that talks to the cluster (sbatch, squeue, a sweep), as it must be started
        to reach the controller: as it is here; on the login node of TwoNodeSlurmCluster."""
        return list(command)

    def run(self, command: list[str], *, check: bool = True, timeout: float = 60, **kwargs):
        import subprocess

        out = subprocess.run(self.client(command), capture_output=True, text=True, env=self.env,
                             timeout=timeout, **kwargs)
        if check and out.returncode != 0:
            raise AssertionError(f"{' '.join(command)} -> {out.returncode}\n{out.stdout}\n{out.stderr}")
        return out

    def job(self, job_id: str) -> dict:
        """`scontrol show job` as a dict (empty once Slurm has forgotten the job)."""
        out = self.run(["scontrol", "show", "job", "-o", str(job_id)], check=False)
        if out.returncode != 0:
            return {}
        fields = {}
        for word in out.stdout.splitlines()[0].split():
            key, _, value = word.partition("=")
            fields.setdefault(key, value)
        return fields

    def state(self, job_id: str) -> str:
        return self.job(job_id).get("JobState", "")

    def wait_for_state(self, job_id: str, states, timeout: float = 180) -> dict:
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} not in {states} after {timeout:.0f} s: {self.job(job_id)}")

    def start_requeued(self, job_id: str, restarts: int = 1, timeout: float = 120) -> None:
        """Wait until the job has been requeued `restarts` times and runs (or ran) again.

        Slurm holds a requeued job (Reason=BeginTime) until the killed run's job credential
        has expired (CRED_EXPIRE_S). Forcing an earlier start (`scontrol update
        StartTime=now`) races with that: slurmd refuses the revoked credential and the job
        ends FAILED without running, so this only waits."""
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if int(info.get("Restarts", 0)) >= restarts:
                state = info.get("JobState")
                if state == "RUNNING" or state == "COMPLETED":
                    return
                if state in self.FAILED_STATES:
                    raise AssertionError(f"job {job_id} ended {state} after its requeue: {info}\n"
                                         f"{self.controller_log(job_id)}")
            time.sleep(0.3)
        raise AssertionError(f"job {job_id} was not requeued {restarts} time(s) and started again "
                             f"within {timeout:.0f} s: {self.job(job_id)}")

    def controller_log(self, job_id: str) -> str:
        """slurmctld's log lines about a job (why it failed to start, for example)."""
        path = self.dir / "log" / "slurmctld.log"
        array = str(job_id).partition("_")[0]
        pattern = re.compile(rf"JobId={array}\b|JobId={array}_")
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        return "slurmctld.log:\n" + "\n".join(line for line in lines if pattern.search(line))

    def completions(self) -> list[dict]:
        """The job completion log (jobcomp/filetxt), one dict per finished job."""
        if not self.jobcomp.exists():
            return []
        records = []
        for line in self.jobcomp.read_text().splitlines():
            record = {}
            for word in line.split():
                key, _, value = word.partition("=")
                record.setdefault(key, value)
            records.append(record)
        return records

    def _started_here(self, pid: int) -> bool:
        """Started by this cluster's daemons (marked environment; a slurmstepd clears its
        environment but keeps slurmd's log open and its folder) or with its SLURM_CONF."""
        environ = _proc_environ(pid)
        if f"ACCORDION_TEST_SLURM={self.dir}".encode() in environ:
            return True
        if f"SLURM_CONF={self.conf}".encode() in environ:
            return True
        return any(path == str(self.dir) or path.startswith(f"{self.dir}/") for path in _proc_paths(pid))

    def job_processes(self, job_id: str) -> list[str]:
        """Processes of this cluster still alive for a job: its tasks (SLURM_JOB_ID in their
        environment) and its slurmstepd daemons ([<job>.batch], [<job>.0], ...)."""
        marker = f"SLURM_JOB_ID={job_id}".encode()
        found = []
        for pid in _all_pids():
            cmd = _proc_cmdline(pid)
            if (marker in _proc_environ(pid) or f"[{job_id}." in cmd) and self._started_here(pid):
                found.append(f"{pid}: {cmd[:200]}")
        return found

    # -- tear-down --------------------------------------------------------------------------
    def leftovers(self) -> list[str]:
        """Processes started for this cluster still alive: its daemons and what they started
        (marked in their environment), and whatever was started with its SLURM_CONF (sbatch, a
        sweep, the job tasks)."""
        me = {os.getpid(), os.getppid()}
        return [f"{pid}: {_proc_cmdline(pid)[:200]}" for pid in _all_pids()
                if pid not in me and self._started_here(pid)]

    def system_changes(self) -> list[str]:
        after = _tree_state(SLURM_SYSTEM_PATHS)
        before = self._system_before
        return ([f"added {p}" for p in sorted(set(after) - set(before))]
                + [f"removed {p}" for p in sorted(set(before) - set(after))]
                + [f"changed {p}" for p in sorted(set(after) & set(before)) if after[p] != before[p]])

    def stop(self) -> None:
        """Cancel every job, then stop slurmd, slurmctld and munged by the pids recorded at
        start (SIGTERM, then SIGKILL after 15 s), and anything they started that outlived them."""
        import signal as _signal
        import subprocess
        import time

        if self._stopped:
            return
        self._stopped = True
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            try:
                self.run(["scancel", "--full", "--user=root"], check=False, timeout=30)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and self.run(
                        ["squeue", "-h", "-o", "%i"], check=False, timeout=30).stdout.strip():
                    time.sleep(0.5)
            except (OSError, subprocess.SubprocessError):
                pass
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(_signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(15)
        # slurmstepd or job processes that outlived slurmd (a test that failed mid-job)
        for line in self.leftovers():
            try:
                os.kill(int(line.split(":")[0]), _signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        deadline = time.monotonic() + 10
        while self.leftovers() and time.monotonic() < deadline:
            time.sleep(0.2)


class TwoNodeSlurmCluster(SlurmCluster):
    """Two Slurm nodes on two "hosts": network namespaces joined by one veth link, each daemon
    with its own host name (a UTS namespace) and a hosts file naming both nodes bound over
    /etc/hosts in its own mount namespace, so that the nodes find each other by name as on a
    cluster. (nsenter, not `ip netns exec`: that remounts /sys, hiding the cgroup file system
    slurmd needs.) Node `nodea` also runs slurmctld and is the login node: every client
    command starts in its network namespace. munged stays on this host; its socket is a file
    both namespaces see. One stand-in GPU per node."""

    NODES = ("nodea", "nodeb")
    NODE = "nodea"

    def __init__(self, directory: Path):
        from accordion_repro.benchmarks.netbench.netns import NamespacePair

        super().__init__(directory)
        self.pair = NamespacePair("slurm")
        self.hosts = self.dir / "hosts"

    def _enter(self, side: int) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{self.pair.namespaces[side]}"]

    def client(self, command: list[str]) -> list[str]:
        return [*self._enter(0), *command]

    def _on_node(self, side: int, command: list[str]) -> list[str]:
        return [*self._enter(side), "unshare", "--mount", "--uts", "sh", "-c",
                f'mount --bind {self.hosts} /etc/hosts && hostname {self.NODES[side]} && exec "$@"',
                "sh", *command]

    PER_NODE = "-%n"

    def controller_host(self) -> str:
        return f"{self.NODE}({self.pair.addresses[0]})"

    def node_table(self) -> list[tuple[str, str, int]]:
        return [(name, addr, 1) for name, addr in zip(self.NODES, self.pair.addresses)]

    def start(self) -> "TwoNodeSlurmCluster":
        import subprocess

        self._system_before = _tree_state(SLURM_SYSTEM_PATHS)
        self.pair.create()
        self.write_config()
        self.hosts.write_text("127.0.0.1 localhost\n" + "".join(
            f"{addr} {name}\n" for name, addr in zip(self.NODES, self.pair.addresses)))
        for node in self.NODES:
            (self.dir / "spool" / node).mkdir(parents=True, exist_ok=True)
        d = self.dir
        self._start("munged", ["munged", "--foreground", f"--key-file={d}/munge/munge.key",
                               f"--socket={self.socket}", f"--pid-file={d}/run/munged.pid",
                               f"--seed-file={d}/munge/munged.seed", f"--log-file={d}/log/munged.log"])
        self._wait("munged to answer on its socket", lambda: self.socket.exists() and subprocess.run(
            ["munge", "-n", "-S", str(self.socket)], capture_output=True, timeout=30,
            env=self.env).returncode == 0, 30)
        self._start("slurmctld", self._on_node(0, ["slurmctld", "-D", "-f", str(self.conf)]))
        for side, node in enumerate(self.NODES):
            self._start(f"slurmd-{node}", self._on_node(side, ["slurmd", "-D", "-N", node, "-f",
                                                               str(self.conf)]))

        def nodes_idle() -> bool:
            out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout.split()
            return out == ["nodea", "idle", "nodeb", "idle"]

        self._wait("sinfo to show nodea and nodeb idle", nodes_idle, 90)
        return self

    def kill_node(self, side: int) -> list[int]:
        """SIGKILL every process on one host (its slurmd, its job steps, their ranks), as a
        node that loses power; the pids killed."""
        import signal as _signal
        import subprocess

        out = subprocess.run(["ip", "netns", "pids", self.pair.namespaces[side]],
                             capture_output=True, text=True).stdout
        pids = [int(token) for token in out.split()]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, _signal.SIGKILL)
        return pids

    def stop(self) -> None:
        if self._stopped:
            return
        try:
            super().stop()
        finally:
            self.pair.teardown()

    def system_changes(self) -> list[str]:
        from accordion_repro.benchmarks.netbench.netns import list_namespaces

        left = [f"namespace {ns} (and its veth end) left" for ns in self.pair.namespaces
                if ns in list_namespaces()]
        return super().system_changes() + left


def _running_cluster(cls: type[SlurmCluster]):
    """A started cluster of `cls`, stopped and checked afterwards; skips, saying why, where it
    cannot run (not root and not installed, no apt-get, no netns); fails instead under CI=true,
    where it must."""
    import atexit
    import shutil
    import sys
    import tempfile

    must = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    if not sys.platform.startswith("linux"):
        pytest.skip("the Slurm tests start a cluster on Linux only")
    if os.geteuid() != 0:
        pytest.skip("the Slurm tests need root: they may apt-get install slurm-wlm and munge, "
                    "and slurmd runs jobs as root")
    if cls is TwoNodeSlurmCluster:
        from accordion_repro.benchmarks.netbench.netns import missing_requirement

        missing = missing_requirement()
        if missing:
            (pytest.fail if must else pytest.skip)(f"no two-node Slurm cluster: {missing}")
    try:
        SlurmCluster.install()
    except SlurmUnavailable as exc:
        (pytest.fail if must else pytest.skip)(f"no Slurm cluster: {exc}")
    # Not under pytest's tmp_path: munged refuses a socket below a folder others cannot enter.
    cluster = cls(tempfile.mkdtemp(prefix="accordion-slurm-"))
    atexit.register(cluster.stop)
    try:
        cluster.start()
    except BaseException as exc:
        cluster.stop()
        if not isinstance(exc, SlurmUnavailable):
            raise
        (pytest.fail if must else pytest.skip)(f"the Slurm cluster did not start: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()
        left, changed = cluster.leftovers(), cluster.system_changes()
        if os.environ.get("ACCORDION_KEEP_SLURM_DIR") != "1" and not left:
            shutil.rmtree(cluster.dir, ignore_errors=True)
        assert not left, f"processes of the test Slurm cluster outlived it: {left}"
        assert not changed, f"the test Slurm cluster changed files outside {cluster.dir}: {changed}"
