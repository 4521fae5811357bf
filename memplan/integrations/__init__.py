"""memplan in the training loops people already use.

- `memplan.integrations.transformers`: `MemplanTrainer`, a Hugging Face `Trainer` whose
  `training_step` runs under a plan (needs `pip install memplan[hf]`).
- `memplan.integrations.lightning`: `MemplanCallback`, a PyTorch Lightning callback that runs
  each batch's forward and backward under a plan (needs `pip install memplan[lightning]`).

Both plan through `memplan.optimize` (memplan.integrations.planned) and import their framework
only when they are imported themselves.
"""
