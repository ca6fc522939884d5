"""One prepared check of the CUDA and NCCL path, for the first minutes on a GPU (`make gpu-check`).

Without a GPU it prints one line and exits 0. With one (at most about 10 minutes on one GPU):
1. the trainer under torchrun, 1 rank, NCCL: PowerSGD Accordion and Top-K Accordion, full-width
   ResNet-18 on synthetic CIFAR-shaped data through dataset.pipeline=device, 300 steps each;
2. a stop after epoch 0 and a resume on CUDA (deterministic kernels), compared value by value
   with the same run uninterrupted;
3. the DDP hook (`Accordion`, asynchronous) under bf16 autocast, a few steps;
4. step times (zero_grad, forward, backward with the DDP hook, SGD step; medians, configurations
   interleaved per round) for fp32, bf16 and channels_last x dense (DDP's all-reduce), our
   PowerSGD at ranks 1/2/4, torch's powerSGD_hook at ranks 1/2/4 and our Top-K 1/10/99 %.
Everything goes to results/gpu/<date>/ (checks.csv, steps.csv, summary.md) to be committed.

`--tiny` runs the same script small on the CPU with gloo (the test suite does), so the GPU's
minutes go to measuring, not to debugging.

    python scripts/gpu_check.py [--tiny] [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from bench_compressors import interleave  # noqa: E402

TIMING = {"epoch_time_s", "compute_time_s", "comm_time_s"}
STEP_CONFIGS = ["dense", "ours powersgd r1", "ours powersgd r2", "ours powersgd r4",
                "torch powerSGD_hook r1", "torch powerSGD_hook r2", "torch powerSGD_hook r4",
                "ours topk 0.01", "ours topk 0.1", "ours topk 0.99"]
LAYOUTS = {"fp32": ("fp32", False), "bf16": ("bf16", False), "channels_last": ("fp32", True)}


def sizes(tiny: bool) -> dict:
    if tiny:
        return dict(device="cpu", backend="gloo", width=0.125, train_size=64, batch=16, epochs=2,
                    steps=2, warmup=2, hook_steps=2)
    return dict(device="cuda", backend="nccl", width=1.0, train_size=12_800, batch=128, epochs=3,
                steps=20, warmup=3, hook_steps=5)


def train_command(s: dict, run_dir: Path, *extra: str) -> list[str]:
    """The trainer under torchrun with one rank, so the NCCL process group is really made."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1",
            "--master_port", str(_free_port()), "-m", "accordion_repro.train",
            "model=resnet18", f"model.width={s['width']}", "dataset=synthetic_cifar10",
            f"dataset.train_size={s['train_size']}", "dataset.test_size=1024",
            "dataset.pipeline=device", f"trainer.device={s['device']}",
            f"dist.backend={s['backend']}", f"trainer.epochs={s['epochs']}",
            f"trainer.batch_size={s['batch']}", "trainer.eval_batch_size=256",
            "trainer.max_eval_steps=2", "schedule=accordion", "schedule.interval=1",
            "logger.wandb.mode=disabled", "trainer.progress=never", f"hydra.run.dir={run_dir}",
            *extra]


def _free_port() -> int:
    from accordion_repro.launch import free_port
    return free_port()


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _run(argv: list[str]) -> tuple[int, str, float]:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    tail = (done.stderr.strip().splitlines() or [""])[-1]
    return done.returncode, tail, time.perf_counter() - start


def trainer_checks(s: dict, work: Path) -> list[dict]:
    rows = []
    # deterministic kernels in the PowerSGD run, which the stop-and-resume check compares with
    runs = {"powersgd accordion": ["compressor=powersgd", "schedule.low=2", "schedule.high=1",
                                   "trainer.deterministic=true"],
            "topk accordion": ["compressor=topk", "schedule.low=0.1", "schedule.high=0.01"]}
    for name, extra in runs.items():
        run_dir = work / name.replace(" ", "_")
        rc, tail, wall = _run(train_command(s, run_dir, *extra))
        row = {"check": f"trainer {name}", "ok": rc == 0, "wall_s": round(wall, 1), "detail": tail}
        if rc == 0:
            m = _metrics(run_dir)
            epoch_times = ", ".join(f"{r['epoch_time_s']:.1f}" for r in m)
            row["detail"] = (f"{sum(r['steps'] for r in m)} steps, final test_acc "
                             f"{m[-1]['test_acc']:.2f}, epoch times {epoch_times} s, "
                             f"compute {sum(r['compute_time_s'] for r in m):.1f} s, comm "
                             f"{sum(r['comm_time_s'] for r in m):.1f} s")
        rows.append(row)
    # stop after epoch 0 and resume, against the PowerSGD run above (uninterrupted)
    common = runs["powersgd accordion"]
    whole, parts = work / "powersgd_accordion", work / "parts"
    codes = [0 if rows[0]["ok"] else 1,
             _run(train_command(s, parts, *common, "trainer.stop_after_epoch=0"))[0],
             _run(train_command(s, parts, *common))[0]]
    same, detail = False, f"exit codes {codes}"
    if codes == [0, 0, 0]:
        a = [{k: v for k, v in r.items() if k not in TIMING} for r in _metrics(whole)]
        b = [{k: v for k, v in r.items() if k not in TIMING} for r in _metrics(parts)]
        same = a == b
        losses = [abs(x["train_loss"] - y["train_loss"]) for x, y in zip(a, b)]
        detail = f"metrics equal: {same}; largest train_loss difference {max(losses):.3g}"
    rows.append({"check": "stop after epoch 0 and resume", "ok": same, "wall_s": "",
                 "detail": detail})
    return rows


def _step_worker(s: dict, out: Path) -> None:
    """In one process with a one-rank group: the hook under bf16, then the step times."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_psgd
    from torch.nn.parallel import DistributedDataParallel

    from accordion_repro.comm.ddp_hook import AccordionHookState, accordion_hook
    from accordion_repro.ddp import Accordion
    from accordion_repro.engine.precision import autocast
    from accordion_repro.models import build_model

    device = torch.device(s["device"])
    if device.type == "cuda":
        torch.cuda.set_device(0)
    store = tempfile.mktemp(prefix="gpu-check-store-")
    dist.init_process_group(s["backend"], init_method=f"file://{store}", rank=0, world_size=1)
    x = torch.randn(s["batch"], 3, 32, 32, device=device)
    y = torch.randint(0, 10, (s["batch"],), device=device)
    results = {}

    def ddp_model(channels_last=False):
        torch.manual_seed(0)
        model = build_model("resnet18", num_classes=10, width=s["width"]).to(device)
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        return model, DistributedDataParallel(model, device_ids=[0] if device.type == "cuda" else None)

    # the DDP hook, asynchronous, under bf16
    model, ddp = ddp_model()
    acc = Accordion(ddp, "powersgd", low=2, high=1, interval=1, async_op=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    losses = []
    for _ in range(s["hook_steps"]):
        optimizer.zero_grad()
        with autocast(device, "bf16"):
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    acc.end_epoch(0, 0.01, 0.01)
    results["hook"] = {"losses": losses, "floats": acc.pop_stats().floats_sent,
                       "dtype": str(next(model.parameters()).grad.dtype)}
    del acc, ddp

    def configuration(name: str, precision: str, channels_last: bool):
        model, ddp = ddp_model(channels_last)
        if name.startswith("ours"):
            _, compressor, level = name.split()
            options = {"rank": int(level[1:])} if compressor == "powersgd" else {"ratio": float(level)}
            ddp.register_comm_hook(AccordionHookState(model, compressor, **options), accordion_hook)
        elif name.startswith("torch"):
            state = torch_psgd.PowerSGDState(process_group=None, start_powerSGD_iter=2,
                                             matrix_approximation_rank=int(name[-1]),
                                             min_compression_rate=1)
            ddp.register_comm_hook(state, torch_psgd.powerSGD_hook)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        layout = torch.channels_last if channels_last else torch.contiguous_format

        def step(_):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            optimizer.zero_grad()
            with autocast(device, precision):
                loss = torch.nn.functional.cross_entropy(ddp(x.contiguous(memory_format=layout)), y)
            loss.backward()
            optimizer.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            return time.perf_counter() - start
        return step, None

    configs = {f"{layout} | {name}": configuration(name, *LAYOUTS[layout])
               for layout in LAYOUTS for name in STEP_CONFIGS}
    samples, seconds = interleave(configs, s["warmup"], s["steps"])
    results["steps"] = {name: statistics.median(v) for name, v in samples.items()}
    results["step_loop_s"] = seconds
    results["device_name"] = (torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu")
    dist.destroy_process_group()
    out.write_text(json.dumps(results))


def write_results(out_dir: Path, s: dict, checks: list[dict], steps: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / "checks.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["check", "ok", "wall_s", "detail"])
        writer.writeheader()
        writer.writerows(checks)
    rows = []
    for key, seconds in steps["steps"].items():
        layout, name = key.split(" | ")
        base = steps["steps"][f"{layout} | dense"]
        rows.append({"layout": layout, "config": name, "median_ms": round(1e3 * seconds, 3),
                     "images_per_s": round(s["batch"] / seconds, 1),
                     "dense_over_this": round(base / seconds, 3)})
    with (out_dir / "steps.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = [f"# GPU check, {datetime.date.today().isoformat()}",
             "", f"Device: {steps['device_name']}; ResNet-18 width {s['width']:g}, batch "
             f"{s['batch']} per rank, one rank (`{s['backend']}`); `python scripts/gpu_check.py"
             + (" --tiny`" if s["device"] == "cpu" else "`") + ".", "",
             "| check | ok | wall s | detail |", "| --- | --- | ---: | --- |"]
    lines += [f"| {c['check']} | {'yes' if c['ok'] else 'NO'} | {c['wall_s']} | {c['detail']} |"
              for c in checks]
    hook_losses = ", ".join(f"{v:.3f}" for v in steps["hook"]["losses"])
    lines += ["", f"DDP hook (async) under bf16: losses {hook_losses}; "
              f"gradients {steps['hook']['dtype']}.", "",
              f"Step times (median of {s['steps']} interleaved rounds after {s['warmup']} warm-up):",
              "", "| layout | config | median ms | images/s | dense / this |",
              "| --- | --- | ---: | ---: | ---: |"]
    lines += [f"| {r['layout']} | {r['config']} | {r['median_ms']} | {r['images_per_s']} | "
              f"{r['dense_over_this']} |" for r in rows]
    (out_dir / "summary.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="the same checks, small, on the CPU")
    parser.add_argument("--out", type=Path, default=None,
                        help="default results/gpu/<date> (results/gpu/tiny-<date> with --tiny)")
    parser.add_argument("--step-worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    s = sizes(args.tiny)
    if args.step_worker:
        _step_worker(s, args.step_worker)
        return 0
    if not args.tiny:
        import torch
        if not torch.cuda.is_available():
            print("gpu-check: no CUDA GPU found (torch.cuda.is_available() is False); nothing run")
            return 0
    today = datetime.date.today().isoformat()
    out_dir = args.out or REPO / "results" / "gpu" / (f"tiny-{today}" if args.tiny else today)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        work = Path(work)
        checks = trainer_checks(s, work)
        result = work / "steps.json"
        rc, tail, wall = _run([sys.executable, str(Path(__file__).resolve()), "--step-worker",
                               str(result)] + (["--tiny"] if args.tiny else []))
        checks.append({"check": "DDP hook under bf16 and step times", "ok": rc == 0,
                       "wall_s": round(wall, 1), "detail": "" if rc == 0 else tail})
        if rc != 0:
            print(f"gpu-check: the step-time worker failed: {tail}", file=sys.stderr)
            return 1
        write_results(out_dir, s, checks, json.loads(result.read_text()))
    failed = [c["check"] for c in checks if not c["ok"]]
    print(f"gpu-check: {len(checks) - len(failed)} of {len(checks)} checks passed in "
          f"{time.perf_counter() - start:.0f} s; results in {out_dir}")
    for name in failed:
        print(f"gpu-check: FAILED {name}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
