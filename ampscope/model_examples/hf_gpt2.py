"""A Hugging Face GPT-2 built from its config: random weights, nothing downloaded.

    pip install 'ampscope[hf]'
    ampscope bench amp-bf16 compile-default --model examples/hf_gpt2.py:make

The model is given its labels, so it returns its own loss (``output.loss``) and the factory
gives none. The inputs are a dict, passed to the model as keyword arguments; their token ids
tell ampscope the tokens per step, and the FLOPs are counted with torch's FlopCounterMode.
"""

from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def token_stream(batch: int, seq_len: int, vocab: int, seed: int, device: torch.device):
    """Token sequences that follow a fixed successor table most of the time: learnable."""
    g = torch.Generator().manual_seed(seed)
    successor = torch.randperm(vocab, generator=g)
    pool = torch.empty(16 * batch, seq_len, dtype=torch.long)
    pool[:, 0] = torch.randint(vocab, (pool.shape[0],), generator=g)
    noise = torch.randint(vocab, pool.shape, generator=g)
    follow = torch.rand(pool.shape, generator=g) < 0.9
    for i in range(1, seq_len):
        pool[:, i] = torch.where(follow[:, i], successor[pool[:, i - 1]], noise[:, i])
    pool = pool.to(device)

    def batch_at(step: int) -> dict[str, torch.Tensor]:
        ids = pool[(step % 16) * batch : (step % 16 + 1) * batch]
        return {"input_ids": ids, "labels": ids}  # the model shifts the labels itself

    return batch_at


def make(ctx):
    on_gpu = ctx.device.type == "cuda"
    if on_gpu:  # GPT-2 small (124M), nanoGPT's vocabulary padding
        config = GPT2Config(vocab_size=50304, n_positions=1024, bos_token_id=0, eos_token_id=0)
        batch, seq_len = ctx.batch_size or 8, 1024
    else:  # a tiny one, quick on a laptop
        config = GPT2Config(
            vocab_size=1024,
            n_positions=64,
            n_embd=64,
            n_layer=2,
            n_head=4,
            bos_token_id=0,
            eos_token_id=0,
        )
        batch, seq_len = ctx.batch_size or 8, 64
    model = GPT2LMHeadModel(config).to(ctx.device)
    return {
        "model": model,
        "batches": token_stream(batch, seq_len, config.vocab_size, ctx.seed, ctx.device),
        "name": "hf-gpt2",
    }
