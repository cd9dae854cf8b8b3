"""A user's model file for ``--model``: one factory a behaviour, and the faults a user makes.

Copied into a temporary folder by ``tests.helpers.user_model``; the tests read its lines.
"""

import time

import torch
from torch import nn

import ampscope

FEATURES, CLASSES = 16, 4


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))

    def forward(self, x):
        return self.body(x)


class TwoInputs(Net):
    def forward(self, x, scale):
        return self.body(x * scale)


class OwnLoss(Net):
    """Returns an object with .loss, as Hugging Face models do when given labels."""

    def forward(self, features, labels):
        logits = self.body(features)
        return type(
            "Out", (), {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}
        )()


def data(seed, n=256):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    y = (x @ torch.randn(FEATURES, CLASSES, generator=g)).argmax(1)
    return x, y


def make(ctx):
    x, y = data(ctx.seed)
    bs = ctx.batch_size or 32
    batches = [(x[i : i + bs], y[i : i + bs]) for i in range(0, len(x), bs)]
    return ampscope.Workload(
        model=Net(), batches=batches, loss=nn.functional.cross_entropy, name="teacher-mlp"
    )


def make_given_flops(ctx):
    answer = make(ctx)
    answer.flops_per_step = 1e6
    return answer


def make_tuple_inputs(ctx):
    x, y = data(ctx.seed)
    return {
        "model": TwoInputs(),
        "batches": lambda step: ((x[:32], torch.tensor(0.5)), y[:32]),
        "loss": nn.functional.cross_entropy,
    }


def make_own_loss(ctx):
    x, y = data(ctx.seed)
    return {"model": OwnLoss(), "batches": lambda step: {"features": x[:32], "labels": y[:32]}}


def make_tokens(ctx):
    emb = nn.Sequential(nn.Embedding(100, 8), nn.Flatten(), nn.Linear(8 * 12, CLASSES))
    ids = torch.randint(100, (8, 12))
    return {
        "model": emb,
        "batches": [(ids, torch.zeros(8, dtype=torch.long))],
        "loss": nn.functional.cross_entropy,
    }


def make_slow_data(ctx):
    x, y = data(ctx.seed)

    def batch(step):
        time.sleep(0.2)
        return x[:32], y[:32]

    return {"model": Net(), "batches": batch, "loss": nn.functional.cross_entropy}


def make_raises(ctx):
    return helper_that_fails()


def helper_that_fails():
    raise ValueError("the data folder is empty")


def make_no_model(ctx):
    return {"batches": []}


def make_no_batches(ctx):
    return ampscope.Workload(model=Net(), batches=None)


def make_not_a_module(ctx):
    return {"model": "resnet", "batches": []}


def make_wrong_width(ctx):
    x, y = data(ctx.seed)
    return {
        "model": nn.Linear(FEATURES + 1, CLASSES),
        "batches": [(x, y)],
        "loss": nn.functional.cross_entropy,
    }


def make_wrong_width_given_flops(ctx):
    answer = make_wrong_width(ctx)
    answer["flops_per_step"] = 1e6
    return answer


def make_generator(ctx):
    x, y = data(ctx.seed)
    return {
        "model": Net(),
        "batches": ((x[:8], y[:8]) for _ in range(3)),
        "loss": nn.functional.cross_entropy,
    }


def make_big(ctx):
    return {
        "model": nn.Linear(1000, 1000),
        "batches": [(torch.randn(2, 1000), torch.randn(2, 1000))],
        "loss": nn.functional.mse_loss,
    }


def make_on_cpu_only(ctx):
    if ctx.device.type == "meta":
        raise RuntimeError("this factory needs real tensors")
    return make(ctx)


def make_typo(ctx):
    x, y = data(ctx.seed)
    return {"model": Net(), "batches": [(x, y)], "lossfn": nn.functional.cross_entropy}


def make_vector_loss(ctx):
    x, y = data(ctx.seed)
    per_example = nn.CrossEntropyLoss(reduction="none")
    return {"model": Net(), "batches": [(x[:8], y[:8])], "loss": per_example}


def make_float_loss(ctx):
    x, y = data(ctx.seed)

    def loss(output, target):
        return nn.functional.cross_entropy(output, target).item()

    return {"model": Net(), "batches": [(x[:8], y[:8])], "loss": loss}


class FailsLater(Net):
    """Trains a few steps, then its forward raises: a fault of theirs in mid-run."""

    calls = 0

    def forward(self, x):
        FailsLater.calls += 1
        if FailsLater.calls > 4:
            raise ValueError("a corrupt sample in the fifth batch")
        return self.body(x)


def make_fails_later(ctx):
    answer = make(ctx)
    answer.model = FailsLater()
    answer.flops_per_step = 1e6  # no counting pass: the forward's calls are the steps'
    return answer


def loss_without_targets(output):
    return output.mean()


def make_loss_one_argument(ctx):
    answer = make(ctx)
    answer.loss = loss_without_targets
    return answer


def make_net_not_model(ctx):
    x, y = data(ctx.seed)
    return {"net": Net(), "batches": [(x, y)], "loss": nn.functional.cross_entropy}


def nan_loss(output, targets):
    return (output - output).div(0.0).mean()  # 0 / 0 in every element


def make_nan_loss(ctx):
    answer = make(ctx)
    answer.loss = nan_loss
    return answer


def make_short_targets(ctx):
    """Targets for 8 of the 32 inputs: torch's cross_entropy refuses them with a message of
    its own that ends in a full stop."""
    x, y = data(ctx.seed)
    return {
        "model": Net(),
        "batches": [(x[:32], y[:8])],
        "loss": nn.functional.cross_entropy,
        "flops_per_step": 1e6,
    }


def make_short_batches(ctx):
    """A DataLoader's way: a full batch of 32, then short ones of 8 (the epoch's end)."""
    x, y = data(ctx.seed)
    return {
        "model": Net(),
        "batches": [(x[:32], y[:32]), (x[32:40], y[32:40]), (x[40:48], y[40:48])],
        "loss": nn.functional.cross_entropy,
    }


def make_token_lengths(ctx):
    """Token ids whose sequence length changes from batch to batch (bucketed lengths)."""
    model = nn.Sequential(nn.Embedding(100, 8), nn.Linear(8, CLASSES))
    g = torch.Generator().manual_seed(ctx.seed)
    batches = [torch.randint(100, (4, length), generator=g) for length in (8, 32, 32)]
    return {
        "model": model,
        "batches": [(ids, ids % CLASSES) for ids in batches],
        "loss": lambda output, target: nn.functional.cross_entropy(
            output.flatten(0, 1), target.flatten()
        ),
    }


def make_loss_without_grad(ctx):
    """A loss computed from a detached output: backward() has nothing to go back through."""
    answer = make(ctx)
    answer.loss = lambda output, target: nn.functional.cross_entropy(output.detach(), target)
    return answer
