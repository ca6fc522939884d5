"""What makes one rank's training step cheaper on this machine: precision, layout, compile, the
input pipeline. ResNet-18 at the study's widths, batch 64 (one rank of the study's 2 x 64).

Each option is timed against fp32 in the same run, in interleaved rounds (every option once per
round), so a machine shared with other work slows every option alike; medians over rounds and
the ratio to fp32 are reported. One thread, as each of the study's two ranks has one core.

- step options: fp32 (the suite's default), bf16 autocast, channels_last, bf16 + channels_last,
  torch.compile (compile time reported apart; `--no-compile` leaves it out);
- input pipeline: images/s of the loader alone (the PIL pipeline of data/images.py, one image
  at a time in the rank's process, against dataset.pipeline=device on the CPU) and of a whole
  fp32 step fed by each.

Writes results/bench/step_options.csv (one row per width and option).

    python scripts/bench_step_options.py [--widths 0.25 0.125] [--rounds 7] [--no-compile]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from accordion_repro.data import DeviceImages
from accordion_repro.data.images import ArrayImageDataset, image_transforms
from accordion_repro.data.settings import ImageSettings
from accordion_repro.engine.precision import autocast
from accordion_repro.models import build_model
from .harness import write_csv

BATCH = 64
CPU = torch.device("cpu")


def _model(width: float, channels_last: bool):
    torch.manual_seed(0)
    model = build_model("resnet18", num_classes=10, width=width)
    return model.to(memory_format=torch.channels_last) if channels_last else model


def _stepper(model, precision: str, channels_last: bool):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    layout = torch.channels_last if channels_last else torch.contiguous_format

    def step(x, y):
        optimizer.zero_grad(set_to_none=True)
        with autocast(CPU, precision):
            loss = F.cross_entropy(model(x.contiguous(memory_format=layout)), y)
        loss.backward()
        optimizer.step()
    return step


def _images(count: int) -> ArrayImageDataset:
    rng = np.random.default_rng(0)
    train, _ = image_transforms(ImageSettings(name="random", augment=True))
    return ArrayImageDataset(rng.integers(0, 256, (count, 32, 32, 3), dtype=np.uint8),
                             rng.integers(0, 10, count), train)


def _pil_batches(dataset, order):
    loader = torch.utils.data.DataLoader(torch.utils.data.Subset(dataset, order), batch_size=BATCH)
    yield from loader


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=float, nargs="+", default=[0.25, 0.125])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--out", default="results/bench/step_options.csv")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    x, y = torch.randn(BATCH, 3, 32, 32), torch.randint(0, 10, (BATCH,))
    rows = []
    for width in args.widths:
        options = {
            "fp32": _stepper(_model(width, False), "fp32", False),
            "bf16": _stepper(_model(width, False), "bf16", False),
            "channels_last": _stepper(_model(width, True), "fp32", True),
            "bf16+channels_last": _stepper(_model(width, True), "bf16", True),
        }
        compile_s = None
        if not args.no_compile:
            compiled = torch.compile(_model(width, False))
            options["compile"] = _stepper(compiled, "fp32", False)
            start = time.perf_counter()
            options["compile"](x, y)
            compile_s = time.perf_counter() - start
        dataset = _images(BATCH * 8)
        device_images = DeviceImages(dataset, CPU)
        order = list(range(len(dataset)))
        fp32 = options["fp32"]
        loaders = {
            "loader pil": lambda: sum(len(b) for b, _ in _pil_batches(dataset, order)),
            "loader device": lambda: sum(len(b) for b, _ in device_images.batches(order, BATCH)),
            "step+pil": lambda: [fp32(b, t) for b, t in _pil_batches(dataset, order[:2 * BATCH])],
            "step+device": lambda: [fp32(b, t) for b, t in device_images.batches(order[:2 * BATCH], BATCH)],
        }
        for step in options.values():  # warm-up
            step(x, y)
        times: dict[str, list[float]] = {name: [] for name in [*options, *loaders]}
        for _ in range(args.rounds):
            for name, step in options.items():
                start = time.perf_counter()
                step(x, y)
                times[name].append(time.perf_counter() - start)
            for name, work in loaders.items():
                start = time.perf_counter()
                work()
                times[name].append(time.perf_counter() - start)
        images = {**{name: BATCH for name in options}, "loader pil": len(order),
                  "loader device": len(order), "step+pil": 2 * BATCH, "step+device": 2 * BATCH}
        base = {"step": statistics.median(times["fp32"]), "loader": statistics.median(times["loader pil"]),
                "step+": statistics.median(times["step+pil"])}
        for name, values in times.items():
            median = statistics.median(values)
            kind = "loader" if name.startswith("loader") else ("step+" if name.startswith("step+") else "step")
            rows.append({"width": width, "option": name, "images": images[name],
                         "median_s": round(median, 5), "images_per_s": round(images[name] / median, 1),
                         "ratio_to_baseline": round(base[kind] / median, 3),
                         "baseline": {"step": "fp32", "loader": "loader pil", "step+": "step+pil"}[kind],
                         "compile_s": round(compile_s, 1) if name == "compile" else "",
                         "rounds": args.rounds})
            r = rows[-1]
            print(f"width {width:<5g} {name:20s} {r['images_per_s']:9.1f} img/s  "
                  f"{r['ratio_to_baseline']:5.2f}x {r['baseline']}"
                  + (f"  (compiling took {compile_s:.0f} s)" if name == "compile" else ""), flush=True)
    write_csv(rows, Path(args.out))

