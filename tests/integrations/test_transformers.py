"""memplan.integrations.transformers: the Hugging Face Trainer under a plan (issue 40).

A tiny GPT-2 (a config, nothing downloaded) is fine-tuned for 20 steps by the plain `Trainer`
and by `MemplanTrainer` from the same seed, under a budget of 70% of the plain step's peak. The
oracles are independent of the plan: the plain run (its parameters, its logged losses, gradient
norms and learning rates) and the plain step's peak, measured by memplan's memory meter (which
shares no code with the planner or the executor) around the plain Trainer's own training step.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")
pytest.importorskip("accelerate", reason="the hf extra is not installed")

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

from memplan.errors import MemplanError  # noqa: E402
from memplan.exec.meter import MemoryMeter  # noqa: E402
from memplan.integrations.transformers import MemplanTrainer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STEPS = 20
SHARE = 0.7  # the budget, of the plain step's peak
TOLERANCE = 0.02  # a measured step may exceed the budget by this share
LOGGED = ("loss", "grad_norm", "learning_rate")
TINY = dict(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=2)
PLAN_OPTIONS = {"measure": True, "min_bytes": 64 * 1024}  # measure every step; storages this small are candidates


class Tokens(torch.utils.data.Dataset):
    """Random token sequences of 64 tokens."""

    def __init__(self, n: int = 400):
        g = torch.Generator().manual_seed(1)
        self.items = torch.randint(0, TINY["vocab_size"], (n, 64), generator=g)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return {"input_ids": self.items[i], "labels": self.items[i]}


class TokenStream(torch.utils.data.IterableDataset):
    """Random token sequences in runs of 8 of one length, the lengths taking turns: with batches of 8,
    the batch shape changes as padding buckets make it change."""

    def __init__(self, lengths: tuple[int, ...] = (64, 20), n: int = 400):
        g = torch.Generator().manual_seed(1)
        self.items = [torch.randint(0, TINY["vocab_size"], (lengths[i // 8 % len(lengths)],), generator=g)
                      for i in range(n)]

    def __iter__(self):
        return iter({"input_ids": t, "labels": t} for t in self.items)


def pad_to_bucket(features):
    """Batches padded to the longest sequence, rounded up to 32 tokens (labels padded with -100)."""
    length = -(-max(len(f["input_ids"]) for f in features) // 32) * 32
    ids = torch.zeros(len(features), length, dtype=torch.long)
    labels = torch.full((len(features), length), -100)
    for row, f in enumerate(features):
        ids[row, :len(f["input_ids"])] = f["input_ids"]
        labels[row, :len(f["labels"])] = f["labels"]
    return {"input_ids": ids, "labels": labels}


class MeteredTrainer(Trainer):
    """The plain Trainer, each training step's peak memory measured (the oracle of the budget)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.peaks: list[int] = []

    def training_step(self, model, inputs, num_items_in_batch=None):
        meter, state = MemoryMeter("cpu"), self.optimizer.optimizer.state
        with meter:
            meter.track((list(model.parameters()), [p.grad for p in model.parameters()],
                         [v for s in state.values() for v in s.values()], inputs, num_items_in_batch))
            meter.reset_peak()
            loss = super().training_step(model, inputs, num_items_in_batch)
        self.peaks.append(meter.peak()["measured_peak_bytes"])
        return loss


def fine_tune(trainer_class, tmp_path, dataset=None, collator=None, **settings):
    """Fine-tune a fresh tiny GPT-2 (seed 0) for STEPS steps; returns the trainer and its model."""
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(**TINY))
    extra = {k: settings.pop(k) for k in ("memory_budget", "planner", "max_plans", "strict", "memplan_options")
             if k in settings}
    args = TrainingArguments(output_dir=str(tmp_path / trainer_class.__name__), per_device_train_batch_size=8,
                             max_steps=STEPS, logging_steps=1, learning_rate=1e-3, lr_scheduler_type="linear",
                             warmup_steps=3, max_grad_norm=0.5, report_to="none", save_strategy="no", use_cpu=True,
                             seed=0, disable_tqdm=True, **settings)
    trainer = trainer_class(model=model, args=args, train_dataset=dataset or Tokens(), data_collator=collator, **extra)
    trainer.train()
    return trainer, model


def logged(trainer) -> list[dict]:
    return [{k: h[k] for k in LOGGED} for h in trainer.state.log_history if "loss" in h]


def memplan_logs(trainer) -> list[dict]:
    return [h for h in trainer.state.log_history if any(k.startswith("memplan/") for k in h)]


def assert_same_training(plain, plain_model, planned, planned_model):
    assert len(logged(plain)) == STEPS
    assert logged(planned) == logged(plain)  # bit-identical floats, as the Trainer logs them
    for (name, a), b in zip(plain_model.named_parameters(), planned_model.parameters()):
        assert torch.equal(a, b), name


@pytest.mark.slow
@pytest.mark.parametrize("precision, accumulation, planner", [
    ("fp32", 1, "autoswap:doa"),  # swaps
    ("fp32", 2, "capuchin"),  # swaps and recomputations; the second micro-batch adds to gradients
    ("bf16", 1, "capuchin"),  # under accelerate's bf16 autocast
])
def test_fine_tuning_under_a_plan_is_plain_fine_tuning_within_its_budget(tmp_path, precision, accumulation, planner):
    settings = dict(gradient_accumulation_steps=accumulation, bf16=precision == "bf16")
    plain, plain_model = fine_tune(MeteredTrainer, tmp_path, **settings)
    budget = int(SHARE * max(plain.peaks))  # of the steady state (the first step runs before the optimizer has state)
    planned, planned_model = fine_tune(MemplanTrainer, tmp_path, memory_budget=budget, planner=planner,
                                       memplan_options=PLAN_OPTIONS, **settings)
    assert_same_training(plain, plain_model, planned, planned_model)
    plans = planned.memplan.stats()
    assert len(plans) == accumulation  # the first micro-batch, and one that adds to gradients
    for plan in plans:
        assert plan["decisions"] > 0 and plan["replanned"] == 0
        assert plan["budget_bytes"] == budget
    measured = [s["measured_peak_bytes"] for plan in plans for s in plan["steps_measured"]]
    assert len(measured) == STEPS * accumulation
    assert max(measured) <= budget * (1 + TOLERANCE)
    reports = memplan_logs(planned)
    assert [r["memplan/planner"] for r in reports] == [planner] * accumulation
    for r in reports:
        assert r["memplan/peak_bytes"] <= r["memplan/budget_bytes"] < r["memplan/unplanned_peak_bytes"]
        assert r["memplan/predicted_overhead"] >= 0


@pytest.fixture(scope="module")
def plain_on_a_stream(tmp_path_factory):
    """The plain Trainer on batches whose shape changes (32 and 64 tokens once padded)."""
    return fine_tune(Trainer, tmp_path_factory.mktemp("plain"), dataset=TokenStream(), collator=pad_to_bucket)


@pytest.mark.slow
def test_a_new_batch_shape_is_planned_when_it_comes(tmp_path, plain_on_a_stream):
    planned, planned_model = fine_tune(MemplanTrainer, tmp_path, memory_budget="70%", planner="autoswap:doa",
                                       memplan_options=PLAN_OPTIONS, dataset=TokenStream(), collator=pad_to_bucket)
    assert_same_training(*plain_on_a_stream, planned, planned_model)
    plans = planned.memplan.stats()
    assert sorted(p["batch"] for p in plans) == ["8x32, 8x32", "8x64, 8x64"]
    for plan in plans:
        assert plan["decisions"] > 0
        assert all(s["measured_peak_bytes"] <= plan["budget_bytes"] * (1 + TOLERANCE) for s in plan["steps_measured"])
    assert sorted(r["memplan/batch"] for r in memplan_logs(planned)) == ["8x32, 8x32", "8x64, 8x64"]


@pytest.mark.slow
def test_a_shape_that_cannot_be_planned_runs_unplanned_and_the_logs_say_why(tmp_path, plain_on_a_stream, caplog):
    planned, planned_model = fine_tune(MemplanTrainer, tmp_path, memory_budget="70%", planner="autoswap:doa",
                                       max_plans=1, memplan_options={"min_bytes": 64 * 1024}, dataset=TokenStream(),
                                       collator=pad_to_bucket)
    assert_same_training(*plain_on_a_stream, planned, planned_model)
    first, second = memplan_logs(planned)
    assert first["memplan/batch"] == "8x64, 8x64" and first["memplan/planner"] == "autoswap:doa"
    assert second["memplan/batch"] == "8x32, 8x32" and "max_plans" in second["memplan/unplanned"]
    assert "run unplanned" in caplog.text


def test_strict_raises_at_the_first_batch_no_plan_meets(tmp_path):
    # neither autoswap:doa nor auto reaches 1 KiB: strict stops training there instead of running unplanned
    with pytest.raises(MemplanError, match="cannot be planned \\(strict\\)"):
        fine_tune(MemplanTrainer, tmp_path, memory_budget="1KiB", planner="autoswap:doa", strict=True)


@pytest.mark.slow
def test_with_torch_compile_the_trainer_trains_compiled_under_its_plans(tmp_path):
    # aot_eager: AOTAutograd and its partitioner without code generation (Inductor: tests/workflows/test_compiled.py)
    compiled = dict(torch_compile=True, torch_compile_backend="aot_eager")
    plain, plain_model = fine_tune(Trainer, tmp_path, **compiled)
    planned, planned_model = fine_tune(MemplanTrainer, tmp_path, memory_budget="80%", planner="auto",
                                       memplan_options={"time_limit_s": 2}, **compiled)
    assert_same_training(plain, plain_model, planned, planned_model)
    plans = planned.memplan.stats()
    assert len(plans) == 1 and plans[0]["executor"] == "compiled" and len(plans[0]["compilations"]) <= 2
    assert all(c["decisions_lowered"] > 0 for c in plans[0]["compilations"])
