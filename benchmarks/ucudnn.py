"""mu-cuDNN (paper 003) in memplan: the family time model against DeepBench, paper 003's
Fig. 9 and Fig. 13 shapes, the optimisers' speed, and micro-batching measured on this CPU.

    .venv/bin/python benchmarks/ucudnn.py [--only fit,fig9,fig13,speed,cpu] [--deepbench DIR]

Writes benchmarks/results/ucudnn_*.{md,json,png}; every table says where its numbers come from:
  fit    DeepBench (measured on V100, P100, GTX 1080 Ti) against today's roofline and the family
         time model fitted on two thirds of DeepBench's layers; errors on the held-out third, per
         GPU and kernel. Also writes the fitted coefficients the `model` source uses
         (memplan/conv/coefficients.json).
  fig9   Fig. 9 shape: AlexNet conv2 (Caffe's geometry, batch 256) forward on the V100 `model`
         source, per batch-size policy under 8, 64 and 512 MiB of workspace. Modelled, not measured.
  fig13  Fig. 13 shape: WR against WD at equal total workspace for AlexNet (batch 256) and
         ResNet-50 (batch 64), V100 `model` source: summed convolution time. Modelled.
  speed  WR's DP for one kernel at batch 256 with `all`, and WD's ILP for ResNet-50, on this CPU.
  cpu    Measured here: does splitting into micro-batches speed up any convolution kernel of
         ResNet-50 or VGG16 at batch 64 with PyTorch's CPU convolution (`cpu` source)?
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

from memplan.conv import fit as F
from memplan.conv.deepbench import read_conv_csv
from memplan.conv.timemodel import write_coefficients
from memplan.cost.profiles import get_profile
from memplan.fileio import atomic_write_text
from memplan.model import CONV_KERNELS

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DEEPBENCH = ROOT.parent / "shared" / "data" / "deepbench"  # ../shared/data/deepbench from the repository
COEFFICIENTS = ROOT / "memplan" / "conv" / "coefficients.json"
HELD_OUT = 1 / 3  # share of DeepBench's layers kept out of the fit
SPLIT_SEED = 0  # the committed model's split
CV_SEEDS = range(1, 6)  # further random splits, to show how much the held-out error depends on the split
MIB = 2**20

log = logging.getLogger("ucudnn-bench")


# --- fit: the family time model against DeepBench --------------------------------------------------


def run_fit(deepbench: Path) -> dict:
    """Fit per GPU on the training layers, write the coefficients, score both models on the held-out ones."""
    data = read_conv_csv(deepbench / "conv_train_fp32.csv")
    shapes = F.layer_shapes(*data.values())
    models, rows = {}, []
    for device, samples in data.items():
        profile = get_profile(device)
        train, test = F.split_by_shape(samples, HELD_OUT, SPLIT_SEED, shapes)
        models[device] = F.fit(train, profile)
        rows += _scores(device, profile, models[device], test)
        rows.append({**_scores(device, profile, models[device], test, by_kind=False)[0],
                     "cv_geomean": _cross_validated(samples, profile, shapes)})
    write_coefficients(models, f"fitted by benchmarks/ucudnn.py on DeepBench's conv_train_fp32.csv, "
                               f"{1 - HELD_OUT:.0%} of the layers (split seed {SPLIT_SEED})", COEFFICIENTS)
    return {"source": "DeepBench (measured) vs roofline and family model (predicted)", "held_out_share": HELD_OUT,
            "rows": rows}


def _scores(device, profile, model, test, by_kind=True) -> list[dict]:
    groups = [(kind, [s for s in test if s[0].kind == kind]) for kind in CONV_KERNELS] if by_kind else [("all", test)]
    out = []
    for kind, samples in groups:
        kernels, measured = [k for k, _ in samples], np.array([t for _, t in samples])
        out.append({"gpu": device, "kernel": kind, "rows": len(samples),
                    "roofline": F.errors(F.roofline(kernels, profile), measured),
                    "model": F.errors(F.predict(model, kernels), measured)})
    return out


def _cross_validated(samples, profile, shapes) -> list[float]:
    """Held-out geometric-mean error of fits on other random splits."""
    out = []
    for seed in CV_SEEDS:
        train, test = F.split_by_shape(samples, HELD_OUT, seed, shapes)
        model = F.fit(train, profile)
        out.append(round(F.errors(F.predict(model, [k for k, _ in test]), np.array([t for _, t in test]))["geomean"], 3))
    return out


def fit_markdown(result: dict) -> str:
    lines = ["| GPU | kernel | held-out rows | roofline median | roofline p90 | roofline geomean | "
             "model median | model p90 | model geomean |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        cells = [f"{r[m][q]:.0%}" for m in ("roofline", "model") for q in ("median", "p90", "geomean")]
        lines.append(f"| {r['gpu']} | {r['kernel']} | {r['rows']} | " + " | ".join(cells) + " |")
    cv = [f"{r['gpu']}: {', '.join(f'{g:.0%}' for g in r['cv_geomean'])}" for r in result["rows"] if "cv_geomean" in r]
    lines += ["", "Model geomean error on the held-out layers of five other random splits: " + "; ".join(cv) + "."]
    return "\n".join(lines) + "\n"


# --- driver ----------------------------------------------------------------------------------------


SECTIONS = {"fit": (run_fit, fit_markdown)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    parser.add_argument("--deepbench", type=Path, default=DEEPBENCH, help="folder with DeepBench's CSV files")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    RESULTS.mkdir(parents=True, exist_ok=True)
    for name in args.only.split(","):
        run, markdown = SECTIONS[name]
        started = time.perf_counter()
        result = run(args.deepbench) if name == "fit" else run()
        result["seconds"] = round(time.perf_counter() - started, 1)
        atomic_write_text(RESULTS / f"ucudnn_{name}.json", json.dumps(result, indent=1, default=str) + "\n")
        atomic_write_text(RESULTS / f"ucudnn_{name}.md", markdown(result))
        print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
