"""Start the ranks of one run: in this process, as N local processes, or by joining torchrun/Slurm.

Workers receive the run's RunSettings (config.validate's, read once; it pickles) and never run
Hydra, so every rank sees the same values. A rank that dies takes the whole job down with its rank and cause: local ranks are
watched by torch.multiprocessing (which terminates the survivors), and under torchrun the
elastic agent does the same; summary.json then says `failed` with the rank and cause.

SIGTERM (what Slurm sends before a time limit) and SIGINT stop a run cleanly: every rank
finishes its current step, the ranks agree to stop, and the run ends as `stopped`, resumable
from its last end-of-epoch checkpoint (the unfinished epoch is redone, so the metrics equal
those of an uninterrupted run). A second signal ends the job at once. The launching process
holds these signals from before the ranks start until the job is over (RELAY), so a signal
while the ranks start up is a stop, not a crash, and one while the launcher shuts down is no
traceback and no stale lock. How the job ended is reported to runlog.py, which owns the run's
status in summary.json.

Inside a submitit job on Slurm (`hydra/launcher=slurm`) submitit's time-limit signal (USR2,
`signal_delay_s` before the limit) stops the run the same way, and then submitit's own handler
saves the job (the same Hydra job, resubmitted) and requeues it; the requeued job resumes from
the run's checkpoint. A run stopped there, by that signal or by Slurm's SIGTERM (requeue,
preemption, scancel), leaves without a result: a result, even "stopped", would tell the waiting
sweep that the job is over while Slurm is about to run it again.

Local ranks rendezvous through a file store and bind gloo to the loopback interface, so a
single-host run listens on no outside address.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import gc
import logging
import multiprocessing
import multiprocessing.resource_tracker
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from accordion_repro.engine import stop
from accordion_repro.engine.settings import TrainerSettings
from accordion_repro.env import env_rank, env_world_size, local_cuda_device, slurm_env
from accordion_repro.errors import TrainingDiverged
from accordion_repro.forkserver_guard import FORKSERVER_DIR, FORKSERVER_OF, PARENT_DIED
from accordion_repro.rundir import record_job_processes
from accordion_repro.runlog import report_status, stop_signal_of
from accordion_repro.options import require_settings
from accordion_repro.run_settings import RunSettings
from accordion_repro.utils import adopt_environment, die_with_parent, pid_alive


class RankFailed(RuntimeError):
    """A rank exited or raised; the message names the rank and the cause."""


class RunStopped(RuntimeError):
    """The run was stopped by a signal after a clean step; rerunning resumes it."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def submitit_requeue_signal() -> signal.Signals | None:
    """Inside a submitit job on Slurm: the signal Slurm sends before the time limit (and on
    preemption), USR2 unless SUBMITIT_PREEMPT_SIGNAL names another; None elsewhere."""
    if os.environ.get("SUBMITIT_EXECUTOR") != "slurm" or "SLURM_JOB_ID" not in os.environ:
        return None
    name = os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2").upper()
    return getattr(signal, name if name.startswith("SIG") else f"SIG{name}", None)


def stop_signals() -> tuple:
    """The signals that stop a run after its current step, here."""
    requeue = submitit_requeue_signal()
    return STOP_SIGNALS + ((requeue,) if requeue and requeue not in STOP_SIGNALS else ())


class _Relay:
    """The launching process's stop signals, held for the life of a job.

    The first signal asks every local rank to stop after its step; a second ends them at once
    (SIGKILL); a later one, or one while no rank runs (before they start, while the launcher
    shuts down), is only counted: no signal finds the launcher without its handler. The first
    is also written to `stop_file`, for ranks that were not yet listening (`starting`).
    """

    def __init__(self):
        self.count, self.last, self.processes, self.previous, self.depth = 0, 0, [], {}, 0
        self.stop_file: Path | None = None

    def __call__(self, signum, frame) -> None:
        self.count += 1
        self.last = signum
        if self.count == 1 and self.stop_file is not None:
            with contextlib.suppress(OSError):
                self.stop_file.write_text(str(int(signum)))
        for process in self.processes:
            if process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signum if self.count == 1 else signal.SIGKILL)

    @contextlib.contextmanager
    def held(self, restore: bool = True):
        """Handle the stop signals in the block; the outermost block installs the handler
        and, with `restore` (not for the CLI's process, which ends with the job), restores
        the handlers it found (`previous`: submitit's among them)."""
        if self.depth == 0:
            self.count, self.last, self.processes = 0, 0, []
            self.previous = {sig: signal.signal(sig, self) for sig in stop_signals()}
            if not restore:  # Python's exit puts back the default handlers: ignore them then
                atexit.register(lambda: [signal.signal(sig, signal.SIG_IGN) for sig in self.previous])
        self.depth += 1
        try:
            yield self
        finally:
            if restore:
                self.depth -= 1
                if self.depth == 0:
                    for sig, handler in self.previous.items():
                        signal.signal(sig, handler)

    def reinstall(self, requested: int) -> None:
        """Take the signals back after an in-process rank's own handler (stop.install) had
        them, counting the stop it was asked for."""
        if self.depth and requested and not self.count:
            self.count, self.last = 1, requested
        for sig in self.previous if self.depth else ():
            signal.signal(sig, self)

    @contextlib.contextmanager
    def starting(self, stop_file: Path):
        """Block the stop signals while ranks are started, and hold back any that comes.

        Blocked: a new process inherits the blocked mask, across fork and exec, so a signal
        sent to a rank before its handler is in place waits, pending, until the rank unblocks
        it (take_stop_signals_early); one sent to this thread waits until the block ends.
        Held back: a signal that another thread of this process takes (OpenBLAS, which numpy
        loads, starts one where OMP_NUM_THREADS is unset, and it blocks nothing) is only
        recorded, and handled when the block ends, once the ranks are known: counted, written
        to `stop_file` for a rank already past its check, and forwarded.
        These signals used to be ignored instead, so that a process started now would inherit
        "ignored" rather than a handler that exec resets; the block does that now. Ignored, a
        stop to the whole job (Ctrl-C, Slurm) was lost when it came before the ranks had
        handlers, and the run trained to its end (once in the suite); and one that OpenBLAS's
        thread took was dropped even once they were blocked.
        """
        self.stop_file = Path(stop_file)
        held_back: list[int] = []
        before = signal.pthread_sigmask(signal.SIG_BLOCK, self.previous)
        for sig in self.previous:
            signal.signal(sig, lambda signum, frame: held_back.append(signum))
        try:
            yield
        finally:
            for sig in self.previous:
                signal.signal(sig, self)
            for signum in held_back:
                self(signum, None)
            signal.pthread_sigmask(signal.SIG_SETMASK, before)

    def stopped_before_start(self) -> RunStopped | None:
        if not self.count:
            return None
        name = signal.Signals(self.last).name
        return RunStopped(f"stopped: {name} before the ranks started, nothing trained; rerun the "
                          f"same command to run it", 128 + self.last)


RELAY = _Relay()


def hold_stop_signals(restore: bool = True):
    """RELAY.held, for the entry point. A function rather than RELAY itself: Hydra's submitit
    launcher pickles `python -m accordion_repro.train`'s main, and cloudpickle copies a
    __main__ function by value with the objects it names, so a job holding RELAY would hold a
    copy that never received submitit's time-limit handler; a module's function is pickled by
    name."""
    return RELAY.held(restore)


def take_stop_signals_early(stop_file: Path) -> None:
    """Rank side of RELAY.starting: make the stop signals stop requests and unblock them (a
    rank inherits them blocked; one that came meanwhile is handled now), then take a stop the
    launcher was asked for before (it wrote the signal to `stop_file`)."""
    stop.install(stop_signals())
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stop_signals())
    with contextlib.suppress(OSError, ValueError):
        stop.request(int(stop_file.read_text()))


def _stop_file(store_file: str) -> Path:
    return Path(f"{store_file}.stop")


def _first_slurm_host() -> str:
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST", "")
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                             text=True, timeout=30, check=True).stdout.split()
        if out:
            return out[0]
    # Fallback parser for "node[01-04,07],other": the first host of the first entry.
    m = re.match(r"([^,\[]+)(?:\[(\d+))?", nodelist)
    if not m:
        raise RuntimeError("cannot find the master host: SLURM_JOB_NODELIST is empty; set MASTER_ADDR")
    return m.group(1) + (m.group(2) or "")


def bind_cuda_device(trainer: TrainerSettings) -> None:
    """Make this rank's GPU the current device before its process group exists: NCCL binds each
    communicator to the current device, and every rank left on device 0 would share one GPU."""
    if trainer.use_cuda:
        torch.cuda.set_device(local_cuda_device(torch.cuda.device_count()))


def _join_env_group(trainer: TrainerSettings, backend: str, timeout_s: int) -> None:
    slurm = slurm_env() if "RANK" not in os.environ else None
    if slurm:
        os.environ.update(slurm)
        os.environ.setdefault("MASTER_ADDR", _first_slurm_host())
        os.environ.setdefault("MASTER_PORT", str(20000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 20000))
    bind_cuda_device(trainer)
    dist.init_process_group(backend=backend, init_method="env://",
                            timeout=datetime.timedelta(seconds=timeout_s))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def resolve_backend(run: RunSettings) -> str:
    if run.dist.backend != "auto":
        return run.dist.backend
    return "nccl" if run.trainer.use_cuda else "gloo"


def _limit_threads(local_world: int) -> None:
    """N CPU ranks on one host must not each start a thread per core."""
    if "OMP_NUM_THREADS" not in os.environ and local_world > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))


def _run(run: RunSettings, run_dir: Path, in_group: bool = False) -> None:
    """Train this rank; leave its process group (when in one) however the run ends.

    After a run that ended on every rank alike (completed, or stopped at the same step), a
    barrier lets no rank shut its group down while another still talks to it: without it, a
    rank that left first once aborted at exit in a clean-clone test run ("terminate called
    without an active exception", after its last epoch was logged), as docs/api.md's own-code
    example did before it too waited at a barrier.
    """
    from accordion_repro.engine.trainer import Trainer

    try:
        Trainer(run, run_dir).fit()
        if in_group:
            gc.collect()  # the run's work handles and their tensors go while the group lives
            dist.barrier()
    except TrainingDiverged as exc:
        raise RankFailed(str(exc)) from None
    finally:
        if in_group:
            dist.destroy_process_group()


def _spawned_worker(local_rank: int, run: RunSettings, run_dir: str, store_file: str,
                    environment: dict[str, str]) -> None:
    # The launcher's environment at launch (a Hydra sweep job's env_set), not the forkserver's;
    # what a library read as the server imported it (OpenMP's OMP_NUM_THREADS) stays the server's,
    # which was the launcher's too.
    adopt_environment(environment)
    signal.signal(PARENT_DIED, signal.SIG_DFL)  # the server's guard, not a rank's
    take_stop_signals_early(_stop_file(store_file))
    settings = run.dist
    world_size = settings.nproc_per_node
    os.environ.update(RANK=str(local_rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(local_rank), LOCAL_WORLD_SIZE=str(world_size))
    if settings.master_addr in ("127.0.0.1", "localhost", "::1"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    die_with_parent()  # a local rank dies with the launching process
    _limit_threads(world_size)
    if local_rank == 0:
        _rank0_logging(Path(run_dir))
    bind_cuda_device(run.trainer)
    dist.init_process_group(backend=resolve_backend(run), init_method=f"file://{store_file}",
                            rank=local_rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=int(settings.timeout_s)))
    _run(run, Path(run_dir), in_group=True)
    _exit_without_finalizing()


def _exit_without_finalizing() -> None:
    """End a local rank whose run succeeded and whose group is gone, skipping interpreter
    finalization.

    A spawned rank (start_method) leaves through sys.exit, and the interpreter's teardown then
    destroys what is left of torch's C++ objects in no fixed order: on a clean clone one FSDP
    rank in some hundred aborted there ("terminate called without an active exception", after
    its last epoch was logged, its run directory complete). A forked rank ends in os._exit
    anyway, after multiprocessing's own clean-up, which this skips too. Nothing is left to do
    at that point (the run directory is written, the group destroyed, an exception would have
    taken the other path), so the rank flushes its streams and log files and leaves with exit
    code 0.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _rank0_logging(run_dir: Path) -> None:
    """Spawned ranks do not inherit Hydra's logging set-up: rank 0 prints the epoch lines and
    appends them to Hydra's job log (train.log), as an in-process run does."""
    logger = logging.getLogger("accordion_repro")
    if logger.handlers:
        return
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(logging.Formatter("%(message)s"))
    job_log = logging.FileHandler(run_dir / "train.log")
    job_log.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    logger.addHandler(console)
    logger.addHandler(job_log)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def _end_of_run(run_dir: Path, submitit_handler, leader: bool) -> None:
    """What a finished job says: nothing, RunStopped (leader only), or, when a signal stopped
    it under submitit on Slurm, no result at all.

    The leader (rank 0, or the process that spawned the local ranks) reads the signal the ranks
    agreed on from summary.json; another rank goes by its own (Slurm signals every task). After
    the time-limit signal the leader hands over to submitit's handler, which pickles the job,
    runs `scontrol requeue` and exits (or, with no requeue left, raises, which the sweep
    reports); after SIGTERM or SIGINT Slurm itself ends the job: exit 128 + signal.
    """
    stopped, where = stop_signal_of(run_dir) if leader else (0, "")
    requeue = submitit_requeue_signal()
    signum = (stopped if leader else stop.requested()) if requeue else 0
    if signum:
        where = where or f"by {signal.Signals(signum).name}"
        if signum == requeue and leader and callable(submitit_handler):
            print(f"stopped: {where}; submitit requeues job {os.environ['SLURM_JOB_ID']}, which "
                  f"resumes from the last checkpoint", file=sys.stderr, flush=True)
            submitit_handler(signum, None)  # checkpoint + scontrol requeue + exit
        print(f"stopped: {where}; leaving without a result (Slurm requeues or ends job "
              f"{os.environ['SLURM_JOB_ID']})", file=sys.stderr, flush=True)
        raise SystemExit(128 + signum)
    if stopped:
        raise RunStopped(f"stopped: {where}; rerun the same command to resume", 128 + stopped)


def launch(run: RunSettings, run_dir: Path) -> None:
    """Run the job `run` (config.validate's RunSettings) describes; raise RankFailed if any
    rank fails and RunStopped if a signal stopped it."""
    require_settings(run, RunSettings, "launch", "config.validate(cfg) returns it")
    with RELAY.held():
        _launch(run, run_dir)


def _launch(run: RunSettings, run_dir: Path) -> None:
    settings = run.dist
    # submitit's time-limit handler, the one found before RELAY (the ranks make its signal a
    # stop request).
    requeue = submitit_requeue_signal()
    submitit_handler = RELAY.previous.get(requeue) if requeue else None
    if settings.launcher in ("auto", "env") and env_world_size() is not None:
        _join_env_group(run.trainer, resolve_backend(run), int(settings.timeout_s))
        _limit_threads(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        stop.install(stop_signals())
        if RELAY.count:  # a signal while this rank joined its group: a stop at the first step
            stop.request(RELAY.last)
        try:
            _run(run, run_dir, in_group=True)
        except RuntimeError as exc:  # gloo's and NCCL's errors; ours are not RuntimeErrors
            lost = lost_peer(str(exc))
            if lost is None:
                raise
            raise RankFailed(f"rank {env_rank()} lost a peer ({lost}): a rank or node of this job "
                             f"died, see its log; the same command resumes from the last "
                             f"checkpoint") from None
        _end_of_run(run_dir, submitit_handler, leader=env_rank() == 0)
        return
    if settings.launcher == "env":
        raise RankFailed("dist.launcher=env but neither torchrun (RANK, WORLD_SIZE) nor Slurm "
                         "(SLURM_PROCID, SLURM_NTASKS > 1) environment variables are set")
    early = RELAY.stopped_before_start()
    if early is not None:
        raise early
    if settings.nproc_per_node == 1:
        stop.install(stop_signals())
        try:
            _run(run, run_dir)
        finally:
            RELAY.reinstall(stop.requested())
    else:
        _remove_stale_stores()
        with tempfile.TemporaryDirectory(prefix=f"{STORE_PREFIX}{os.getpid()}-") as store_dir:
            _spawn(run, run_dir, os.path.join(store_dir, "store"))
    _end_of_run(run_dir, submitit_handler, leader=True)


STORE_PREFIX = "accordion-store-"  # + the launcher's pid: the local ranks' rendezvous folder


def _remove_stale_stores() -> None:
    """Remove the rendezvous folders of launchers ended by SIGKILL (no `finally` ran): this
    user's, whose pid in the name no longer runs on this host."""
    for path in Path(tempfile.gettempdir()).glob(f"{STORE_PREFIX}*-*"):
        pid = path.name[len(STORE_PREFIX):].split("-")[0]
        with contextlib.suppress(OSError):
            if pid.isdigit() and path.stat().st_uid == os.getuid() and not pid_alive(int(pid)):
                shutil.rmtree(path, ignore_errors=True)


# What a CPU rank imports, imported once by the server its ranks are forked from (start_method):
# what accordion_repro.train imports, never that module itself, which each rank runs as
# __mp_main__ (multiprocessing's main-module fix-up warns when it was imported already); first,
# the guard that makes the server die with the launcher (forkserver_guard.py).
RANK_MODULES = ["accordion_repro.forkserver_guard", "hydra", "accordion_repro.config", "accordion_repro.data", "accordion_repro.rundir",
                "accordion_repro.launch", "accordion_repro.engine.trainer", "torchvision"]


def start_method(run: RunSettings) -> str:
    """How local ranks start. On the CPU, "forkserver": each rank is forked from one server
    process that imported torch, torchvision (and so torch._dynamo) and the trainer once, where
    a spawned rank imports them itself (about 4 CPU-s each; torch's own start_processes names
    forkserver for this, pytorch#133010). The server starts inside RELAY.starting, so it, and
    every rank forked from it, blocks the stop signals until a rank installs its handlers and
    unblocks them, as a spawned rank does; the server leaves when the launcher does
    (multiprocessing closes its pipe), and the ranks with it (die_with_parent). With CUDA,
    "spawn": a rank must be the first to touch CUDA in its process, and nothing here has
    checked that the server's imports never do on a GPU machine. "spawn" too where the
    server's Unix socket would not fit its address (a long TMPDIR, as on some clusters): the
    forkserver would not start."""
    if run.trainer.use_cuda or len(_forkserver_socket_path()) > _UNIX_SOCKET_PATH_MAX:
        return "spawn"
    return "forkserver"


_UNIX_SOCKET_PATH_MAX = 107  # sun_path is 108 bytes with its terminating NUL


def _forkserver_socket_path() -> str:
    """As long as the path multiprocessing gives the forkserver's socket:
    <tempdir>/pymp-XXXXXXXX/listener-XXXXXXXX."""
    return os.path.join(tempfile.gettempdir(), "pymp-" + "X" * 8, "listener-" + "X" * 8)


def _spawn(run: RunSettings, run_dir: Path, store_file: str) -> None:
    # torch's "Terminating process N via signal SIGTERM" after a failure: the job's own error
    # line says what happened.
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    method = start_method(run)
    if method == "forkserver":
        multiprocessing.set_forkserver_preload(RANK_MODULES)  # once the server runs: unused
        # what the server's guard reads (forkserver_guard.py), set before the server starts.
        # The pymp-* folder is the server's to remove only where this process made it: one
        # forked from a process that had made it (a test harness's CLI) shares it with others.
        os.environ[FORKSERVER_OF] = str(os.getpid())
        made_here = multiprocessing.process.current_process()._config.get("tempdir") is None
        directory = multiprocessing.util.get_temp_dir()
        if made_here:
            os.environ[FORKSERVER_DIR] = directory
        else:
            os.environ.pop(FORKSERVER_DIR, None)
    # Started here, not inside RELAY.starting: multiprocessing starts its resource tracker
    # (once per process) with SIGINT and SIGTERM blocked and then unblocks them, which would
    # undo the block RELAY.starting holds.
    multiprocessing.resource_tracker.ensure_running()
    with RELAY.starting(_stop_file(store_file)):
        context = mp.start_processes(_spawned_worker,
                                     args=(run, str(run_dir), store_file, dict(os.environ)),
                                     nprocs=run.dist.nproc_per_node, join=False, start_method=method)
        RELAY.processes = context.processes
    # every process of the job, so that no rerun takes the run directory over while one lives
    record_job_processes(run_dir, [p.pid for p in context.processes] + _forkserver_pid())
    try:
        while not context.join():
            pass
    except mp.ProcessRaisedException as exc:
        index, trace = _root_cause(context, exc.error_index, str(exc))
        cause = _cause_line(trace)
        message = f"rank {index} failed: {cause}"
        report_status(run_dir, "failed", error=message)
        # A cause the suite names itself (a diverged loss) or the system's (a full disk: an
        # errno) is the whole story; anything else keeps its traceback, under the error line.
        whole = cause.startswith(_OWN_CAUSES) or _SYSTEM_ERROR.match(cause)
        raise RankFailed(message if whole else f"{message}\n{trace}") from None
    except mp.ProcessExitedException as exc:
        if RELAY.count >= 2:  # our own SIGKILL, the user's second signal: a stop, not a crash
            signum = RELAY.last
            where = (f"{signal.Signals(signum).name} twice: the ranks were ended at once; resumes "
                     f"from the last end-of-epoch checkpoint")
            report_status(run_dir, "stopped", stopped=where, stop_signal=int(signum))
            raise RunStopped(f"stopped: {where}; rerun the same command to resume", 128 + signum) from None
        message = f"rank {exc.error_index} died: {exc}"
        report_status(run_dir, "failed", error=message)
        raise RankFailed(message) from None
    finally:
        RELAY.processes, RELAY.stop_file = [], None
        for process in context.processes:  # leave no rank behind
            if process.is_alive():
                process.terminate()
                process.join(10)
        for path in context.error_files:  # torch writes a failed rank's traceback there, and
            with contextlib.suppress(OSError):  # reads it, but leaves the file in the temp dir
                os.unlink(path)


def _forkserver_pid() -> list[int]:
    """The forkserver's pid, where multiprocessing runs one for this process (private state:
    none where it is not found)."""
    import multiprocessing.forkserver

    pid = getattr(getattr(multiprocessing.forkserver, "_forkserver", None), "_forkserver_pid", None)
    return [pid] if isinstance(pid, int) else []


# A rank that fails because a peer went away names the peer's loss, not its cause.
_PEER_LOSS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
              "Socket Timeout", "Timed out waiting", "DistBackendError", "ProcessGroupGloo")
_OWN_CAUSES = ("training diverged",)
_SYSTEM_ERROR = re.compile(r"(\w+Error: )?\[Errno \d+\]")  # OSError and its kin, with errno


def lost_peer(message: str) -> str | None:
    """'Read error [10.0.0.2]:23250: Connection reset by peer' from a collective's error when
    a peer went away (its process or its node), else None. Under torchrun and Slurm each
    node's survivors say so in one line, naming the lost peer's address; torch.multiprocessing's
    survivors are sorted out by _root_cause instead."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    if not any(marker in first for marker in _PEER_LOSS):
        return None
    first = re.sub(r"^\[[^\]]*\.(cc|cpp):\d+\]\s*", "", first)  # the C++ source location
    return first.split(". ")[0].strip().rstrip(".")


def _cause_line(trace: str) -> str:
    """The last line of a traceback, without the class of an exception the suite raises."""
    lines = [line for line in trace.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else trace
    for prefix in ("accordion_repro.launch.RankFailed: ", "accordion_repro.errors.TrainingDiverged: "):
        last = last.removeprefix(prefix)
    return last


def _root_cause(context, first: int, first_trace: str) -> tuple[int, str]:
    """(rank, traceback) of the rank whose failure caused the others': the first failure that
    is not a lost peer, else the first failure. torch wrote each failed rank's traceback to
    its error file; the survivors have been ended by now."""
    import pickle

    traces = {first: first_trace}
    for index, path in enumerate(context.error_files):
        if index != first:
            with contextlib.suppress(OSError, EOFError, pickle.UnpicklingError):
                with open(path, "rb") as f:
                    traces[index] = pickle.load(f)
    for index in sorted(traces, key=lambda i: (i != first, i)):
        if not any(marker in _cause_line(traces[index]) for marker in _PEER_LOSS):
            return index, traces[index]
    return first, first_trace
