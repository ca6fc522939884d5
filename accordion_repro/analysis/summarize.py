"""From run-epoch rows to one row per run: final metric, totals, measured and predicted time.

Totals are sums of the per-epoch lines of metrics.jsonl (the official "Total Floats Comm" is
per worker, summed over iterations); the final metric is the last epoch's, as the paper reports.
"""

from __future__ import annotations

import pandas as pd

from accordion_repro.analysis.collect import (PAPER_MODEL_SIZES, RUN_DIR, first_value, model_variant,
                                              numerics, numerics_keys)
from accordion_repro.comm.registry import compressor
from accordion_repro.costmodel import ALLREDUCE, predict_epoch_time, resolve_network

RUN_COLUMNS = ("run.name", "run.table", "run.figure", "run.method", "run.label", "seed",
               "scale.name", "model.name", "dataset.name", "compressor.name", "schedule.name",
               "schedule.low", "schedule.high")


def predicted_run_time(epochs: pd.DataFrame, net, workers: int | None) -> float:
    """Sum over epochs of the cost model's epoch time; each epoch keeps its own bytes and
    collectives per step because Accordion changes them from epoch to epoch."""
    network = resolve_network(net)
    name = first_value(epochs, "compressor.name")
    op = compressor(name).WIRE_OP if name else ALLREDUCE  # how the run's logged bytes travel
    world = workers if workers is not None else int(first_value(epochs, "summary.world_size") or 1)
    total = 0.0
    for row in epochs.itertuples(index=False):
        steps = int(row.steps)
        if steps > 0:
            total += predict_epoch_time(
                compute_s_per_step=float(row.compute_time_s) / steps, steps=steps,
                bytes_per_step=float(row.bytes_sent) / steps,
                collectives_per_step=float(row.collectives) / steps, op=op, net=network, workers=world)
    return total


def summarize_runs(frame: pd.DataFrame, net="10gbit", workers: int | None = None) -> pd.DataFrame:
    """One row per run, in run-directory order. `workers` None = each run's own world size."""
    columns = [RUN_DIR, *RUN_COLUMNS, "metric", "final", "epochs", "total_floats",
               "total_bytes", "train_time_s", "world_size", "predicted_workers",
               "predicted_time_s", "model.variant", "numerics", "global_batches"]
    if frame.empty:
        return pd.DataFrame(columns=columns)
    records = []
    for run_dir, epochs in frame.groupby(RUN_DIR, sort=True):
        epochs = epochs.sort_values("epoch", kind="stable")
        last = epochs.iloc[-1]
        metric = "test_acc" if "test_acc" in epochs and pd.notna(last.get("test_acc")) else "val_ppl"
        world_size = first_value(epochs, "summary.world_size")
        world_size = None if world_size is None else int(world_size)
        records.append({
            RUN_DIR: run_dir,
            **{column: first_value(epochs, column) for column in RUN_COLUMNS},
            "metric": metric,
            "final": float(last[metric]),
            "epochs": len(epochs),
            "total_floats": float(epochs["floats_sent"].sum()),
            "total_bytes": float(epochs["bytes_sent"].sum()),
            "train_time_s": float(epochs["epoch_time_s"].sum()),
            "world_size": world_size,
            "predicted_workers": workers if workers is not None else world_size,
            "predicted_time_s": predicted_run_time(epochs, net, workers),
            "model.variant": model_variant({key: first_value(epochs, key)
                                                 for key in ("model.name", *PAPER_MODEL_SIZES)}),
            "numerics": numerics({key: first_value(epochs, key)
                                  for key in numerics_keys(epochs.columns)}),
            # the distinct global batch sizes the run trained with (labels of the batch tables)
            "global_batches": tuple(sorted({int(b) for b in epochs["global_batch"].dropna()}))
            if "global_batch" in epochs else (),
        })
    return pd.DataFrame(records, columns=columns)
