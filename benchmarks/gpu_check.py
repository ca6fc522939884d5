"""One prepared check of the CUDA and NCCL path, for the first minutes on a GPU (`make gpu-check`).

It runs in the environment it is given and installs nothing (`make gpu-check PYTHON=python3`,
or `python3 -m benchmarks.gpu_check` from the repository root: the package need not be
installed).
Without a GPU it prints one line and exits 0. With one, these parts run, each in its own
process with a time limit, the whole check within --budget-s (default 450 s, under 8 minutes):

- hook and step times: the DDP hook (`Accordion`, asynchronous) under bf16, then step times
  (zero_grad, forward, backward with the hook, SGD step; medians, configurations interleaved)
  for fp32, bf16 and channels_last x DDP's all-reduce, our PowerSGD at ranks 1/2/4, torch's
  powerSGD_hook at ranks 1/2/4 and our Top-K 1/10/99 % (benchmarks/gpu_parts.py);
- multi-gpu equality (2+ GPUs, up to 4; skipped, and said so, on one): the async hook equals
  the sync hook bit for bit, levels that compress nothing equal plain DDP, Top-K replicas are
  identical after N steps;
- models: images/s of a training step per CIFAR model at fp32, bf16 and channels_last;
- pipeline: images/s of dataset.pipeline=device against the PIL pipeline;
- trainer powersgd / topk accordion, and a stop after epoch 0 and resume compared value by
  value with the uninterrupted run: the trainer under torchrun, 1 rank, NCCL. They need Hydra
  and omegaconf (the trainer's entry point); without them they are skipped with that reason.

A part that runs past its limit is killed with its whole process group (torchrun's ranks
included) and named: "gpu-check: DID NOT FINISH: <part> (stopped after N s)". Process groups
have a short timeout too (pg_timeout_s), so a hung collective fails its part early. Results go
to results/gpu/<date>-<gpu>/ (checks.csv, steps.csv, models.csv, pipeline.csv, summary.md).

`--tiny` runs the same parts small on the CPU with gloo (the test suite does), so the GPU's
minutes go to measuring, not to debugging.

    python -m benchmarks.gpu_check [--tiny] [--out DIR] [--only PART ...] [--budget-s S]
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from accordion_repro.run_layout import PROJECT_ROOT as REPO

PARTS_MODULE = f"{__package__}.gpu_parts"  # run from REPO with REPO on PYTHONPATH (_env)
TIMING = {"epoch_time_s", "compute_time_s", "comm_time_s"}
# Each part's own limit in seconds on a GPU (--tiny: the same; the budget bounds the total).
PART_LIMITS = {"hook and step times": 150, "multi-gpu equality": 120, "models": 120,
               "pipeline": 60, "trainer powersgd accordion": 120, "trainer topk accordion": 120,
               "stop after epoch 0 and resume": 150}
PARTS = list(PART_LIMITS)
TRAINER_PARTS = PARTS[4:]
HANG_ENV = "ACCORDION_GPU_CHECK_HANG"  # as benchmarks/gpu_parts.py


def sizes(tiny: bool) -> dict:
    if tiny:
        return dict(device="cpu", backend="gloo", width=0.125, train_size=64, batch=16, epochs=2,
                    steps=1, warmup=1, hook_steps=2, model_steps=1, pipeline_batches=2,
                    pipeline_rounds=1, equality_world=3, equality_batch=4, equality_steps=2,
                    pg_timeout_s=60, threads=1)
    return dict(device="cuda", backend="nccl", width=1.0, train_size=12_800, batch=128, epochs=3,
                steps=20, warmup=3, hook_steps=5, model_steps=10, pipeline_batches=16,
                pipeline_rounds=5, equality_world=None, equality_batch=32, equality_steps=20,
                pg_timeout_s=60, threads=None)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env() -> dict:
    """The children import this checkout whether or not it is installed."""
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": str(REPO) + (os.pathsep + path if path else "")}


def run_limited(argv: list[str], limit_s: float) -> tuple[str, str, float]:
    """Run argv in its own session, killed with its whole process group after `limit_s`.

    Returns (status, last stderr line, seconds): status "ok", "failed" or "timeout".
    """
    start = time.perf_counter()
    process = subprocess.Popen(argv, cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = process.communicate(timeout=max(limit_s, 1))
        status = "ok" if process.returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        _, err = process.communicate()
        status = "timeout"
    tail = (err.strip().splitlines() or [""])[-1]
    return status, tail, time.perf_counter() - start


class Budget:
    """The whole check's deadline; each part gets its own limit or what is left, the less."""

    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds

    def limit(self, part: str) -> float:
        return min(PART_LIMITS[part], self.deadline - time.monotonic())


def train_command(s: dict, run_dir: Path, *extra: str) -> list[str]:
    """The trainer under torchrun with one rank, so the NCCL process group is really made."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1",
            "--master_port", str(_free_port()), "-m", "accordion_repro.train",
            "model=resnet18", f"model.width={s['width']}", "dataset=synthetic_cifar10",
            f"dataset.train_size={s['train_size']}", "dataset.test_size=1024",
            "dataset.pipeline=device", f"trainer.device={s['device']}",
            f"dist.backend={s['backend']}", f"dist.timeout_s={s['pg_timeout_s']}",
            f"trainer.epochs={s['epochs']}", f"trainer.batch_size={s['batch']}",
            "trainer.eval_batch_size=256", "trainer.max_eval_steps=2", "schedule=accordion",
            "schedule.interval=1", "logger.wandb.mode=disabled", "trainer.progress=never",
            f"hydra.run.dir={run_dir}", *extra]


TRAINER_RUNS = {
    # deterministic kernels in the PowerSGD run, which the stop-and-resume check compares with
    "trainer powersgd accordion": ["compressor=powersgd", "schedule.low=2", "schedule.high=1",
                                   "trainer.deterministic=true"],
    "trainer topk accordion": ["compressor=topk", "schedule.low=0.1", "schedule.high=0.01"],
}


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _trainer_missing() -> str | None:
    """Why the trainer parts cannot run here (its entry point needs Hydra), or None."""
    try:
        import hydra  # noqa: F401
        import omegaconf  # noqa: F401
    except ImportError as exc:
        return (f"skipped: {exc.name or exc} is not installed (the trainer's entry point needs Hydra "
                "and omegaconf; docs/gpu.md installs them offline)")
    return None


def _hung(argv: list[str], part: str) -> list[str]:
    """argv, or a process that sleeps in its place when the hang stand-in names this part."""
    if os.environ.get(HANG_ENV) == part:
        return [sys.executable, "-c", "import time; time.sleep(3600)"]
    return argv


def trainer_part(part: str, s: dict, work: Path, limit: float) -> dict:
    if part in TRAINER_RUNS:
        run_dir = work / part.replace(" ", "_")
        status, tail, wall = run_limited(_hung(train_command(s, run_dir, *TRAINER_RUNS[part]),
                                               part), limit)
        row = {"status": status, "wall_s": round(wall, 1), "detail": tail}
        if status == "ok":
            m = _metrics(run_dir)
            epoch_times = ", ".join(f"{r['epoch_time_s']:.1f}" for r in m)
            row["detail"] = (f"{sum(r['steps'] for r in m)} steps, final test_acc "
                             f"{m[-1]['test_acc']:.2f}, epoch times {epoch_times} s, "
                             f"compute {sum(r['compute_time_s'] for r in m):.1f} s, comm "
                             f"{sum(r['comm_time_s'] for r in m):.1f} s")
        return row
    # stop after epoch 0 and resume, against the uninterrupted PowerSGD run
    common = TRAINER_RUNS["trainer powersgd accordion"]
    whole, parts = work / "trainer_powersgd_accordion", work / "parts"
    if not (whole / "metrics.jsonl").exists():
        return {"status": "skipped", "wall_s": "",
                "detail": "skipped: needs the finished trainer powersgd accordion run"}
    start, deadline = time.perf_counter(), time.monotonic() + limit
    codes = []
    for extra in (["trainer.stop_after_epoch=0"], []):
        status, tail, _ = run_limited(_hung(train_command(s, parts, *common, *extra), part),
                                      deadline - time.monotonic())
        codes.append(status)
        if status != "ok":
            return {"status": status, "wall_s": round(time.perf_counter() - start, 1),
                    "detail": tail}
    a = [{k: v for k, v in r.items() if k not in TIMING} for r in _metrics(whole)]
    b = [{k: v for k, v in r.items() if k not in TIMING} for r in _metrics(parts)]
    losses = [abs(x["train_loss"] - y["train_loss"]) for x, y in zip(a, b)]
    return {"status": "ok" if a == b else "failed", "wall_s": round(time.perf_counter() - start, 1),
            "detail": f"metrics equal: {a == b}; largest train_loss difference {max(losses):.3g}"}


def worker_part(part: str, s: dict, work: Path, limit: float) -> tuple[dict, dict | None]:
    """Run one of benchmarks/gpu_parts.py's parts; (its row, its result or None)."""
    result = work / (part.replace(" ", "_") + ".json")
    status, tail, wall = run_limited([sys.executable, "-m", PARTS_MODULE, part, json.dumps(s),
                                      str(result)], limit)
    data = json.loads(result.read_text()) if status == "ok" and result.exists() else None
    if status == "ok" and data is None:
        status, tail = "failed", "the part wrote no result"
    row = {"status": status, "wall_s": round(wall, 1), "detail": "" if status == "ok" else tail}
    if data and data.get("skipped"):
        row.update(status="skipped", detail=f"skipped: {data['skipped']}")
    return row, data


def _gpu_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def _write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def write_results(out_dir: Path, s: dict, device_name: str, checks: list[dict],
                  results: dict, command: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_csv(out_dir / "checks.csv", checks)
    lines = [f"# GPU check, {datetime.date.today().isoformat()}", "",
             f"Device: {device_name}; ResNet-18 width {s['width']:g} (all CIFAR models in "
             f"`models`), batch {s['batch']} per rank; `{command}`.", "",
             "| part | check | status | wall s | detail |", "| --- | --- | --- | ---: | --- |"]
    lines += [f"| {c['part']} | {c['check']} | {c['status']} | {c['wall_s']} | {c['detail']} |"
              for c in checks]
    steps = results.get("hook and step times")
    if steps:
        rows = []
        for key, seconds in steps["steps"].items():
            layout, name = key.split(" | ")
            base = steps["steps"][f"{layout} | dense"]
            rows.append({"layout": layout, "config": name, "median_ms": round(1e3 * seconds, 3),
                         "images_per_s": round(s["batch"] / seconds, 1),
                         "dense_over_this": round(base / seconds, 3)})
        _write_csv(out_dir / "steps.csv", rows)
        hook_losses = ", ".join(f"{v:.3f}" for v in steps["hook"]["losses"])
        lines += ["", f"DDP hook (async) under bf16: losses {hook_losses}; "
                  f"gradients {steps['hook']['dtype']}.", "",
                  f"DDP step times, one rank (median of {s['steps']} interleaved rounds after "
                  f"{s['warmup']} warm-up; ours against torch's powerSGD_hook):", "",
                  "| layout | config | median ms | images/s | dense / this |",
                  "| --- | --- | ---: | ---: | ---: |"]
        lines += [f"| {r['layout']} | {r['config']} | {r['median_ms']} | {r['images_per_s']} | "
                  f"{r['dense_over_this']} |" for r in rows]
    for part, title, columns in (
            ("models", "Training step per CIFAR model (no communication)",
             ["model", "layout", "median_ms", "images_per_s"]),
            ("pipeline", "Input pipelines alone", ["pipeline", "median_s", "images_per_s"])):
        data = results.get(part)
        if data and data.get("rows"):
            _write_csv(out_dir / f"{part}.csv", data["rows"])
            lines += ["", f"{title}:", "", "| " + " | ".join(columns) + " |",
                      "|" + " --- |" * len(columns)]
            lines += ["| " + " | ".join(str(r[c]) for c in columns) + " |" for r in data["rows"]]
    (out_dir / "summary.md").write_text("\n".join(lines) + "\n")


def _no_gpu_line() -> tuple[str, int] | None:
    """(one line, exit code) when there is nothing to check here, else None."""
    try:
        import torch
    except ImportError:
        return (f"gpu-check: torch is not importable by {sys.executable}; run it with the "
                "interpreter of your torch environment (make gpu-check PYTHON=...)", 2)
    if not torch.cuda.is_available():
        present = gpu_present()
        if present is None:
            return ("gpu-check: no CUDA GPU found (torch.cuda.is_available() is False); "
                    "nothing run", 0)
        return (f"gpu-check: a GPU is present ({present}) but CUDA is not usable from "
                f"{sys.executable}: {_cuda_unusable_because(torch)}; nothing run", 1)
    return None


def gpu_present() -> str | None:
    """What says an NVIDIA GPU is on this machine whatever torch thinks (the driver's /proc
    entries, its device node), or None."""
    gpus = sorted(Path("/proc/driver/nvidia/gpus").glob("*"))
    if gpus:
        return f"{len(gpus)} in /proc/driver/nvidia/gpus"
    if Path("/dev/nvidia0").exists():
        return "/dev/nvidia0"
    return None


def _cuda_unusable_because(torch) -> str:
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a build without CUDA (install a CUDA build)"
    try:
        torch.cuda.init()
    except Exception as exc:  # the driver's own words: too old, not loaded, no device visible
        return " ".join(str(exc).split())
    return "torch.cuda.is_available() is False (CUDA_VISIBLE_DEVICES hides every device?)"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="the same parts, small, on the CPU")
    parser.add_argument("--out", type=Path, default=None,
                        help="default results/gpu/<date>-<gpu> (results/gpu/tiny-<date> with --tiny)")
    parser.add_argument("--only", nargs="+", choices=PARTS, metavar="PART",
                        help=f"run these parts only ({'; '.join(PARTS)})")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="the whole check's limit (default 450 s; --tiny, on a CPU: 1500 s)")
    args = parser.parse_args(argv)
    if not args.tiny and (nothing := _no_gpu_line()):
        print(nothing[0])
        return nothing[1]
    import torch

    s = sizes(args.tiny)
    device_name = torch.cuda.get_device_name(0) if not args.tiny else "cpu (--tiny, gloo)"
    today = datetime.date.today().isoformat()
    out_dir = args.out or REPO / "results" / "gpu" / (
        f"tiny-{today}" if args.tiny else f"{today}-{_gpu_slug(device_name)}")
    args.budget_s = args.budget_s or (1500.0 if args.tiny else 450.0)
    budget = Budget(args.budget_s)
    start = time.perf_counter()
    checks, results, unfinished = [], {}, []
    no_trainer = _trainer_missing()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        work = Path(work)
        for part in args.only or PARTS:
            limit = budget.limit(part)
            if limit < 5:
                row = {"status": "not started", "wall_s": "",
                       "detail": f"the {args.budget_s:.0f} s budget ran out"}
                data = None
            elif part in TRAINER_PARTS and no_trainer:
                row, data = {"status": "skipped", "wall_s": "", "detail": no_trainer}, None
            elif part in TRAINER_PARTS:
                row, data = trainer_part(part, s, work, limit), None
            else:
                row, data = worker_part(part, s, work, limit)
            if row["status"] in ("timeout", "not started"):
                unfinished.append(part)
                if row["status"] == "timeout":
                    row["detail"] = f"stopped after {limit:.0f} s: {row['detail']}".rstrip(": ")
                print(f"gpu-check: DID NOT FINISH: {part} ({row['detail']})", flush=True)
            if data is not None:
                results[part] = data
            sub_rows = (data or {}).get("rows") if part == "multi-gpu equality" else None
            if sub_rows:
                checks += [{"part": part, "check": r["check"],
                            "status": "ok" if r["ok"] else "failed", "wall_s": row["wall_s"],
                            "detail": r["detail"]} for r in sub_rows]
            else:
                checks.append({"part": part, "check": part, **row})
        command = f"python -m {__package__}.gpu_check" + (" --tiny" if args.tiny else "")
        write_results(out_dir, s, device_name, checks, results, command)
    failed = [c for c in checks if c["status"] in ("failed", "timeout", "not started")]
    passed = sum(c["status"] == "ok" for c in checks)
    skipped = [c for c in checks if c["status"] == "skipped"]
    print(f"gpu-check: {passed} of {len(checks)} checks passed, {len(skipped)} skipped, in "
          f"{time.perf_counter() - start:.0f} s; results in {out_dir}")
    for c in skipped:
        print(f"gpu-check: skipped {c['check']}: {c['detail'].removeprefix('skipped: ')}")
    for c in failed:
        print(f"gpu-check: FAILED {c['check']} ({c['status']}): {c['detail']}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
