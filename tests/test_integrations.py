"""The Lightning and Hugging Face callbacks, each on a tiny model with the real library.

Each record is checked against what the trainer itself reports: the losses the module saw,
the gradient norm before clipping, the Trainer's own logged loss and gradient norm.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from ampscope.core import events as ev
from ampscope.core import records
from tests.helpers import events_of

pytestmark = pytest.mark.slow  # Lightning and Transformers take seconds to import


def only_run(root: Path) -> records.RunRecord:
    (run,) = records.list_runs(root)
    return records.load_run(run.path)


# --------------------------------------------------------------------------- Lightning


def lightning_fit(root: Path, inf_at: int = -1, fail_at: int = -1, **trainer_kw):
    pl = pytest.importorskip("lightning.pytorch")
    from torch.utils.data import DataLoader, TensorDataset

    from ampscope.integrations.lightning import LightningCallback

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
            )
            self.losses: list[float] = []
            self.norms: list[float] = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x).float(), y)
            if batch_idx == fail_at:
                raise ValueError(f"bad batch {batch_idx}")
            if batch_idx == inf_at:
                loss = loss * math.inf
            self.losses.append(loss.item())
            return loss

        def on_before_optimizer_step(self, optimizer) -> None:
            grads = [p.grad.flatten() for p in self.parameters() if p.grad is not None]
            self.norms.append(torch.cat(grads).norm().item())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(96, 8), torch.randn(96, 1)), batch_size=4)
    module = Tiny()
    options = dict(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[LightningCallback(name="lit", runs_dir=root)],
    )
    trainer = pl.Trainer(**(options | trainer_kw))
    trainer.fit(module, data)
    return module, only_run(root)


def test_lightning_fit_leaves_a_record_with_the_losses_and_norms_it_saw(tmp_path: Path) -> None:
    module, run = lightning_fit(
        tmp_path, max_steps=6, accumulate_grad_batches=2, gradient_clip_val=0.01
    )
    assert run.status == "ok" and run.hello is not None and run.hello.source == "watch"
    assert run.hello.config["steps"] == 6 and run.hello.config["precision"] == "fp32"
    steps = [e for e in run.events if isinstance(e, ev.StepEvent)]
    assert [s.step for s in steps] == list(range(6))
    pairs = [sum(module.losses[i : i + 2]) / 2 for i in range(0, 12, 2)]
    assert [s.loss for s in steps] == pytest.approx(pairs, rel=1e-5)
    assert [s.grad_norm for s in steps] == pytest.approx(module.norms, rel=1e-5)
    assert min(module.norms) > 0.01  # the norm before Lightning clipped to 0.01
    assert all(s.samples_per_s == pytest.approx(8e3 / s.step_ms, rel=1e-3) for s in steps)


def test_lightning_amp_fp16_skipped_step_is_recorded(tmp_path: Path) -> None:
    pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.plugins import MixedPrecision

    plugin = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", init_scale=256.0))
    module, run = lightning_fit(tmp_path, inf_at=3, max_steps=6, plugins=[plugin])
    steps = [e for e in run.events if isinstance(e, ev.StepEvent)]
    assert run.hello is not None and run.hello.config["precision"] == "amp-fp16"
    assert [s.step for s in steps if s.skipped] == [3]
    assert [s.loss_scale for s in steps] == [256.0] * 3 + [128.0] * 3
    assert run.done is not None and run.done.skipped_steps == 1


def test_lightning_failure_ends_the_record_failed(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="bad batch 2"):
        lightning_fit(tmp_path, fail_at=2, max_steps=6)
    run = only_run(tmp_path)
    assert run.status == "failed" and run.done is not None
    assert run.done.error == "ValueError: bad batch 2" and run.done.steps_done == 2


# --------------------------------------------------------------------------- Hugging Face


def test_hf_trainer_record_matches_the_trainers_own_logs(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from ampscope.integrations.hf import HFTrainerCallback

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=1,
        n_head=2,
        n_embd=16,
        vocab_size=64,
        n_positions=16,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(config)
    data = [
        {"input_ids": torch.randint(0, 64, (16,)), "labels": torch.randint(0, 64, (16,))}
        for _ in range(64)
    ]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=5,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_grad_norm=0.0,  # no clipping: every step's norm is the Trainer's logged one
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
    )
    callback = HFTrainerCallback(name="hf", runs_dir=tmp_path / "runs")
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    trainer.train()

    run = only_run(tmp_path / "runs")
    assert run.status == "ok" and run.hello is not None and run.hello.config["steps"] == 5
    steps = [e for e in run.events if isinstance(e, ev.StepEvent)]
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert [s.loss for s in steps] == pytest.approx([float(h["loss"]) for h in logged], abs=1e-4)
    assert [s.grad_norm for s in steps] == pytest.approx(
        [float(h["grad_norm"]) for h in logged], rel=1e-4
    )
    tokens = 4 * 16 * 2  # batch x sequence x accumulated micro-batches, padding included
    assert all(s.tokens_per_s * s.step_ms / 1e3 == pytest.approx(tokens, rel=1e-3) for s in steps)
    params = model.num_parameters(exclude_embeddings=True)
    flops = 6 * params * tokens  # the Trainer's own estimate
    assert all(s.tflops * s.step_ms * 1e9 == pytest.approx(flops, rel=1e-3) for s in steps)
    assert not events_of(run.path, ev.ErrorEvent)


def test_hf_grad_norm_is_withheld_where_the_trainer_clipped() -> None:
    pytest.importorskip("transformers")
    from ampscope.integrations.hf import unclipped_or_nan

    # clip_grad_norm_ leaves a clipped norm just under max_norm; an unclipped one as it was
    norms = torch.tensor([0.3, 1.0 * 1.0 / (1.0 + 1e-6), 0.999999])
    out = [unclipped_or_nan(n, 1.0).item() for n in norms]
    assert out[0] == pytest.approx(0.3) and math.isnan(out[1]) and math.isnan(out[2])
