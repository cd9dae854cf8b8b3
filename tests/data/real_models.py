"""Small models of the shapes users bring, as ``--model`` factories: a ViT built on
``nn.MultiheadAttention``, a character LSTM, a CNN with BatchNorm and a ReLU MLP.

Each is CPU-fast (a few ms a step); the tests check ampscope's figures for them against
torch's own (forward hooks, saved tensors, torch.profiler).
"""

import torch
from torch import nn

import ampscope

IMAGE, PATCH, CHANNELS, CLASSES = 16, 4, 3, 10
VOCAB, SEQ = 32, 24


class Block(nn.Module):
    """A pre-norm transformer block on ``nn.MultiheadAttention`` (q/k/v in ``in_proj_weight``,
    ``out_proj`` called through ``F.multi_head_attention_forward``)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    def __init__(self, width: int = 32, depth: int = 3, heads: int = 4) -> None:
        super().__init__()
        patches = (IMAGE // PATCH) ** 2
        self.patch = nn.Linear(CHANNELS * PATCH * PATCH, width)
        self.pos = nn.Parameter(torch.zeros(1, patches, width))
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(depth)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        b = images.shape[0]
        p = images.unfold(2, PATCH, PATCH).unfold(3, PATCH, PATCH)  # b c h w ph pw
        p = p.permute(0, 2, 3, 1, 4, 5).reshape(b, -1, CHANNELS * PATCH * PATCH)
        x = self.blocks(self.patch(p) + self.pos)
        return self.head(self.norm(x).mean(1))


class CharLSTM(nn.Module):
    def __init__(self, width: int = 48) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.lstm = nn.LSTM(width, width, num_layers=2, batch_first=True)
        self.out = nn.Linear(width, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(self.lstm(self.embed(tokens))[0])


class BatchNormCNN(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(CHANNELS, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(2 * width, CLASSES),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.body(images)


def relu_mlp_model(width: int = 256, layers: int = 4) -> nn.Module:
    parts: list[nn.Module] = [nn.Linear(64, width), nn.ReLU()]
    for _ in range(layers - 2):
        parts += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*parts, nn.Linear(width, CLASSES))


def _images(ctx, n: int = 4):
    g = torch.Generator().manual_seed(ctx.seed)
    bs = ctx.batch_size or 16
    return [
        (
            torch.randn(bs, CHANNELS, IMAGE, IMAGE, generator=g),
            torch.randint(0, CLASSES, (bs,), generator=g),
        )
        for _ in range(n)
    ]


def _loss_per_token(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))


def vit(ctx):
    return ampscope.Workload(
        model=ViT(), batches=_images(ctx), loss=nn.functional.cross_entropy, name="mha-vit"
    )


def char_lstm(ctx):
    g = torch.Generator().manual_seed(ctx.seed)
    bs = ctx.batch_size or 16
    text = torch.randint(0, VOCAB, (4, bs, SEQ + 1), generator=g)
    batches = [(t[:, :-1], t[:, 1:]) for t in text]
    return ampscope.Workload(
        model=CharLSTM(), batches=batches, loss=_loss_per_token, name="char-lstm"
    )


def bn_cnn(ctx):
    return ampscope.Workload(
        model=BatchNormCNN(), batches=_images(ctx), loss=nn.functional.cross_entropy, name="bn-cnn"
    )


def relu_mlp(ctx):
    g = torch.Generator().manual_seed(ctx.seed)
    bs = ctx.batch_size or 64
    batches = [
        (torch.randn(bs, 64, generator=g), torch.randint(0, CLASSES, (bs,), generator=g))
        for _ in range(4)
    ]
    return ampscope.Workload(
        model=relu_mlp_model(), batches=batches, loss=nn.functional.cross_entropy, name="relu-mlp"
    )


def wide_mlp(ctx):
    """Parameters dominate (a 2048 x 2048 layer, a small batch): the optimizer step peaks."""
    g = torch.Generator().manual_seed(ctx.seed)
    bs = ctx.batch_size or 8
    model = nn.Sequential(
        nn.Linear(64, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, CLASSES)
    )
    batches = [(torch.randn(bs, 64, generator=g), torch.randint(0, CLASSES, (bs,), generator=g))]
    return ampscope.Workload(
        model=model, batches=batches, loss=nn.functional.cross_entropy, name="wide-mlp"
    )


def _mlp_batches(ctx, sizes: tuple[int, ...]):
    g = torch.Generator().manual_seed(ctx.seed)
    return [
        (torch.randn(n, 64, generator=g), torch.randint(0, CLASSES, (n,), generator=g))
        for n in sizes
    ]


def growing_mlp(ctx):
    """Batches that change size, the first a small one: 8, then 48, then 16 samples (a
    bucketed or shuffled pipeline). A step's peak is the 48's."""
    torch.manual_seed(ctx.seed)
    model = relu_mlp_model()
    return {
        "model": model,
        "batches": _mlp_batches(ctx, (8, 48, 16)),
        "loss": nn.functional.cross_entropy,
    }


def largest_mlp(ctx):
    """growing_mlp's model with its largest batch alone: the reference it is measured at."""
    torch.manual_seed(ctx.seed)
    model = relu_mlp_model()
    return {
        "model": model,
        "batches": _mlp_batches(ctx, (48,)),
        "loss": nn.functional.cross_entropy,
    }
