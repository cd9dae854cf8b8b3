"""Models nobody on the project wrote, each with one layer planted to overflow fp16.

``make_gpt2``: a tiny Hugging Face GPT-2 built from its config (nothing downloaded) whose
``transformer.h.1.mlp.c_fc`` weights are scaled so that its outputs pass 65504.
``make_encoder``: torch's own ``nn.TransformerEncoder``, with ``encoder.layers.1.linear1``
planted the same way.
"""

import torch
from torch import nn

PLANT = 2e5  # weights this many times larger: outputs near 1e5, beyond fp16's 65504


def make_gpt2(ctx):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(ctx.seed)
    config = GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=100,
        n_positions=16,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        model.transformer.h[1].mlp.c_fc.weight.mul_(PLANT)
    g = torch.Generator().manual_seed(ctx.seed)
    ids = torch.randint(0, 100, (4, 4, 16), generator=g)
    batches = [({"input_ids": b, "labels": b}, None) for b in ids]
    return {"model": model, "batches": batches, "name": "planted-hf-gpt2"}


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(32, 2, dim_feedforward=64, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.encoder(x).mean(dim=1))


def make_encoder(ctx):
    torch.manual_seed(ctx.seed)
    model = Encoder()
    with torch.no_grad():
        model.encoder.layers[1].linear1.weight.mul_(PLANT)
    g = torch.Generator().manual_seed(ctx.seed)
    x = torch.randn(4, 8, 6, 32, generator=g)
    y = torch.randint(0, 4, (4, 8), generator=g)
    batches = list(zip(x, y, strict=True))
    loss = nn.functional.cross_entropy
    return {"model": model, "batches": batches, "loss": loss, "name": "planted-encoder"}
