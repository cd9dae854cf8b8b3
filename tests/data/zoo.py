"""A zoo of small models of the kinds users bring, each a ``--model`` factory (docs/model.md).

Every model is tiny (a few thousand to a few ten thousand parameters): one training step takes
milliseconds on one CPU thread, so the zoo's tests (tests/test_zoo.py) can run each model
through every command. Each one differs from ampscope's own workloads in a way that has
misled a command before:

- ``vit``: a ViT whose attention is ``nn.MultiheadAttention`` (it calls ``out_proj.weight``
  itself and keeps q/k/v in one Parameter: Linear modules that never run as modules);
- ``encoder``: torch's own ``nn.TransformerEncoder`` (the same attention inside);
- ``hf_gpt2``: Hugging Face GPT-2 from a config (``Conv1D``, not ``nn.Linear``; its own loss);
- ``hf_bert``: Hugging Face BERT from a config, sequence classification, its own loss;
- ``lstm`` and ``gru``: character language models on torch's recurrent kernels;
- ``cnn_bn``: convolutions with BatchNorm (running statistics are buffers, not parameters);
- ``dw_separable``: depthwise (``groups == channels``) and pointwise convolutions;
- ``tied``: a language model whose output head is its embedding (one Parameter, two uses);
- ``unused``: a model holding modules its forward never calls;
- ``root_computes``: a model whose root module computes in its own ``forward`` with its own
  Parameter, beside its children;
- ``unet``: a U-Net (GroupNorm, SiLU, strided convolutions down, ``ConvTranspose2d`` up, one of
  them grouped, skip concatenations) scoring every pixel;
- ``hf_llama``: Hugging Face's ``LlamaForCausalLM`` from a small ``LlamaConfig`` (RMSNorm,
  rotary embeddings, grouped-query attention, SwiGLU), its own loss;
- ``moe``: a mixture of experts with data-dependent top-2 routing, whose last two experts get
  tokens only from step ``LATE_FROM`` on (the batches before hold no token routed to them);
- ``root_exp``: a root module whose own forward scales and exponentiates (no matmul);
- ``tied_to_device``: ``tied`` built by a factory that ends with ``.to(ctx.device)``, as
  docs/model.md shows (moving a model to the meta device unties its weights).

The batches are one fixed batch served every step (the MoE's: one until ``LATE_FROM``, another
after), so a few steps of AdamW make the loss fall on any of them. Dropout is off: a test can then run a model's first step again, on the
same weights and batch, and compare each figure with its own. Nothing is downloaded: the Hugging Face models are built from configs.
"""

from __future__ import annotations

import torch
from torch import nn

BATCH = 8
SEQ = 16  # tokens a sequence (a multiple of 16, as fp8's kernels ask)
VOCAB = 64
WIDTH = 32  # a multiple of 16: the linear layers fp8 can take
IMAGE = 8  # pixels a side


def tokens(seed: int, batch: int = BATCH, seq: int = SEQ) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, seq), generator=g)


def images(seed: int, channels: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(BATCH, channels, IMAGE, IMAGE, generator=g)
    return x, torch.randint(0, 10, (BATCH,), generator=g)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy over (batch, seq, vocab) logits."""
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def next_tokens(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and their next tokens (the targets), both (batch, seq)."""
    ids = tokens(seed, seq=SEQ + 1)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def workload(model: nn.Module, batch: object, name: str, loss: object = None) -> dict:
    """The factory's answer: one batch, served at every step."""
    answer = {"model": model, "batches": lambda step: batch, "name": name}
    if loss is not None:
        answer["loss"] = loss
    return answer


# ---------------------------------------------------------------------------------------------
# Attention: nn.MultiheadAttention, nn.TransformerEncoder


class Block(nn.Module):
    """A pre-norm ViT block on ``nn.MultiheadAttention``."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 2 * width)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


class TinyViT(nn.Module):
    """8x8 images in 2x2 patches (16 tokens), two blocks, a class token-free mean head."""

    def __init__(self, width: int = WIDTH, blocks: int = 2, heads: int = 2, patch: int = 2):
        super().__init__()
        self.patch = patch
        self.embed = nn.Linear(3 * patch * patch, width, bias=False)  # 12 -> 32: stays bf16
        self.pos = nn.Parameter(torch.zeros(1, (IMAGE // patch) ** 2, width))
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(blocks))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.patch
        b, c, _, _ = x.shape
        patches = x.unfold(2, p, p).unfold(3, p, p).permute(0, 2, 3, 1, 4, 5)
        x = self.embed(patches.reshape(b, -1, c * p * p)) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(dim=1))


def make_vit(ctx):
    torch.manual_seed(ctx.seed)
    return workload(TinyViT(), images(ctx.seed), "zoo-vit", nn.functional.cross_entropy)


class Encoder(nn.Module):
    """torch's own TransformerEncoder over token embeddings, a classifier on the mean."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        layer = nn.TransformerEncoderLayer(
            WIDTH, 2, dim_feedforward=64, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(ids)).mean(dim=1))


def make_encoder(ctx):
    torch.manual_seed(ctx.seed)
    ids = tokens(ctx.seed)
    labels = ids[:, 0] % 4
    return workload(Encoder(), (ids, labels), "zoo-encoder", nn.functional.cross_entropy)


# ---------------------------------------------------------------------------------------------
# Hugging Face, from configs (no download)


def make_hf_gpt2(ctx):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(ctx.seed)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=SEQ,
        n_embd=WIDTH,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    ids = tokens(ctx.seed)
    batch = {"input_ids": ids, "labels": ids}  # the model shifts its labels itself
    return workload(GPT2LMHeadModel(config), batch, "zoo-hf-gpt2")


def make_hf_bert(ctx):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(ctx.seed)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=SEQ,
        num_labels=4,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    ids = tokens(ctx.seed)
    batch = {"input_ids": ids, "labels": ids[:, 0] % 4}
    return workload(BertForSequenceClassification(config), batch, "zoo-hf-bert")


# ---------------------------------------------------------------------------------------------
# Recurrent language models


class RecurrentLM(nn.Module):
    def __init__(self, cell: type[nn.RNNBase]) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.rnn = cell(WIDTH, WIDTH, num_layers=1, batch_first=True)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(ids))
        return self.head(out)


def make_lstm(ctx):
    torch.manual_seed(ctx.seed)
    return workload(RecurrentLM(nn.LSTM), next_tokens(ctx.seed), "zoo-lstm", lm_loss)


def make_gru(ctx):
    torch.manual_seed(ctx.seed)
    return workload(RecurrentLM(nn.GRU), next_tokens(ctx.seed), "zoo-gru", lm_loss)


# ---------------------------------------------------------------------------------------------
# Convolutions


def make_cnn_bn(ctx):
    torch.manual_seed(ctx.seed)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )
    return workload(model, images(ctx.seed), "zoo-cnn-bn", nn.functional.cross_entropy)


def make_dw_separable(ctx):
    torch.manual_seed(ctx.seed)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1, groups=16),  # depthwise
        nn.Conv2d(16, 32, 1),  # pointwise
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )
    return workload(model, images(ctx.seed), "zoo-dw-separable", nn.functional.cross_entropy)


# ---------------------------------------------------------------------------------------------
# Shapes of a module tree that differ from ours


class TiedLM(nn.Module):
    """An MLP language model whose output head reuses the embedding's weight."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 64), nn.GELU(), nn.Linear(64, WIDTH))
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied: one Parameter
        nn.init.normal_(self.embed.weight, std=WIDTH**-0.5)  # logits of order 1

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        return self.head(x + self.mlp(x))


def make_tied(ctx):
    torch.manual_seed(ctx.seed)
    return workload(TiedLM(), next_tokens(ctx.seed), "zoo-tied", lm_loss)


class WithUnused(nn.Module):
    """A classifier that keeps an auxiliary head and a dropout it never calls (a head kept for
    fine-tuning later, a layer switched off by a flag)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(WIDTH, 64), nn.ReLU(), nn.Linear(64, 32))
        self.aux_head = nn.Linear(32, 16)  # never called
        self.spare = nn.Dropout(0.1)  # never called
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def make_unused(ctx):
    torch.manual_seed(ctx.seed)
    g = torch.Generator().manual_seed(ctx.seed)
    x = torch.randn(BATCH * 2, WIDTH, generator=g)
    y = torch.randint(0, 4, (BATCH * 2,), generator=g)
    return workload(WithUnused(), (x, y), "zoo-unused", nn.functional.cross_entropy)


class RootComputes(nn.Module):
    """A model whose own forward does a matmul with its own Parameter, between its children:
    no leaf module produces that product."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(WIDTH, WIDTH)
        self.mix = nn.Parameter(torch.randn(WIDTH, WIDTH) / WIDTH**0.5)
        self.out = nn.Linear(WIDTH, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        return self.out(torch.tanh(h @ self.mix))


def make_root_computes(ctx):
    torch.manual_seed(ctx.seed)
    g = torch.Generator().manual_seed(ctx.seed)
    x = torch.randn(BATCH * 2, WIDTH, generator=g)
    y = torch.randint(0, 4, (BATCH * 2,), generator=g)
    return workload(RootComputes(), (x, y), "zoo-root-computes", nn.functional.cross_entropy)


def make_root_overflow(ctx):
    """``root_computes`` with its own matrix 1e5 times larger: under fp16 autocast its product
    overflows inside the root's forward, outside every module (not in FACTORIES: a fault, not a
    kind of model)."""
    answer = make_root_computes(ctx)
    with torch.no_grad():
        answer["model"].mix.mul_(1e5)
    answer["name"] = "zoo-root-overflow"
    return answer


# ---------------------------------------------------------------------------------------------
# A U-Net


def conv_block(inputs: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(inputs, outputs, 3, padding=1), nn.GroupNorm(4, outputs), nn.SiLU()
    )


class UNet(nn.Module):
    """Two levels down (strided convolutions) and up (transposed convolutions, the deeper one
    grouped), the encoder's maps concatenated into the decoder's; a 1x1 convolution scores
    each pixel's class. No linear layer."""

    def __init__(self, width: int = 8, classes: int = 4) -> None:
        super().__init__()
        c = width
        self.enc1 = conv_block(3, c)  # 8x8
        self.down1 = nn.Conv2d(c, 2 * c, 3, stride=2, padding=1)  # 4x4
        self.enc2 = conv_block(2 * c, 2 * c)
        self.down2 = nn.Conv2d(2 * c, 4 * c, 3, stride=2, padding=1)  # 2x2
        self.mid = conv_block(4 * c, 4 * c)
        self.up2 = nn.ConvTranspose2d(4 * c, 2 * c, 2, stride=2, groups=2)  # 4x4, grouped
        self.dec2 = conv_block(4 * c, 2 * c)  # its input: up2's and enc2's maps
        self.up1 = nn.ConvTranspose2d(2 * c, c, 2, stride=2)  # 8x8
        self.dec1 = conv_block(2 * c, c)
        self.out = nn.Conv2d(c, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(self.down1(e1))
        m = self.mid(self.down2(e2))
        d2 = self.dec2(torch.cat([self.up2(m), e2], dim=1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], dim=1))
        return self.out(d1)


def make_unet(ctx):
    torch.manual_seed(ctx.seed)
    x, _ = images(ctx.seed)
    g = torch.Generator().manual_seed(ctx.seed + 1)
    masks = torch.randint(0, 4, (BATCH, IMAGE, IMAGE), generator=g)  # a class a pixel
    return workload(UNet(), (x, masks), "zoo-unet", nn.functional.cross_entropy)


# ---------------------------------------------------------------------------------------------
# Hugging Face Llama, from a config


def make_hf_llama(ctx):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(ctx.seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,  # grouped-query attention: k and v project to 16
        max_position_embeddings=SEQ,
        attention_dropout=0.0,
    )
    ids = tokens(ctx.seed)
    batch = {"input_ids": ids, "labels": ids}  # the model shifts its labels itself
    return workload(LlamaForCausalLM(config), batch, "zoo-hf-llama")


# ---------------------------------------------------------------------------------------------
# A mixture of experts whose routing changes with the data

EXPERTS = 8
LATE_EXPERTS = (6, 7)  # get tokens only from step LATE_FROM on
LATE_FROM = 4
LATE_TOKENS = 48  # token ids from here on are routed to the late experts, the others never


class Expert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(WIDTH, 64)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(64, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class MoE(nn.Module):
    """A language model with one mixture-of-experts layer: a learned router picks two experts
    a token (top-2, gates by softmax), and an expert runs only when it has tokens. A fixed
    affinity of each token id for the late experts (strongly for, or against) makes the routing
    to them a matter of the data: token ids below ``LATE_TOKENS`` never reach them."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)
        self.router = nn.Linear(WIDTH, EXPERTS, bias=False)
        self.experts = nn.ModuleList(Expert() for _ in range(EXPERTS))
        self.norm_out = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)
        affinity = torch.zeros(VOCAB, EXPERTS)
        late = list(LATE_EXPERTS)
        affinity[:LATE_TOKENS, late] = -30.0
        affinity[LATE_TOKENS:, late] = 30.0
        self.register_buffer("affinity", affinity)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        h = self.norm(x).flatten(0, 1)
        scores = self.router(h) + self.affinity[ids.flatten()]
        top, chosen = scores.topk(2, dim=-1)
        gates = torch.softmax(top.float(), dim=-1)
        mixed = torch.zeros(h.shape, dtype=torch.float32, device=h.device)
        for e, expert in enumerate(self.experts):
            rows, slot = (chosen == e).nonzero(as_tuple=True)
            if rows.numel():  # an expert without tokens does not run
                out = expert(h[rows]).float() * gates[rows, slot].unsqueeze(-1)
                mixed = mixed.index_add(0, rows, out)
        x = x + mixed.to(x.dtype).view_as(x)
        return self.head(self.norm_out(x))


def make_moe(ctx):
    torch.manual_seed(ctx.seed)
    g = torch.Generator().manual_seed(ctx.seed)
    early = torch.randint(0, LATE_TOKENS, (BATCH, SEQ + 1), generator=g)
    late = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    early_batch = (early[:, :-1].contiguous(), early[:, 1:].contiguous())
    late_batch = (late[:, :-1].contiguous(), late[:, 1:].contiguous())
    answer = workload(MoE(), early_batch, "zoo-moe", lm_loss)
    answer["batches"] = lambda step: early_batch if step < LATE_FROM else late_batch
    return answer


# ---------------------------------------------------------------------------------------------
# A root that computes elementwise; a tied model moved to the context's device


class RootExp(nn.Module):
    """A root module whose own forward scales its child's output by its own Parameter and
    exponentiates it: elementwise work that no leaf module holds."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(WIDTH, WIDTH)
        self.scale = nn.Parameter(torch.full((WIDTH,), 0.5))
        self.out = nn.Linear(WIDTH, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.exp(torch.tanh(self.inp(x)) * self.scale))


def make_root_exp(ctx):
    torch.manual_seed(ctx.seed)
    g = torch.Generator().manual_seed(ctx.seed)
    x = torch.randn(BATCH * 2, WIDTH, generator=g)
    y = torch.randint(0, 4, (BATCH * 2,), generator=g)
    return workload(RootExp(), (x, y), "zoo-root-exp", nn.functional.cross_entropy)


def make_tied_to_device(ctx):
    """As docs/model.md writes a factory: the model built, then moved to ``ctx.device``."""
    torch.manual_seed(ctx.seed)
    model = TiedLM().to(ctx.device)
    return workload(model, next_tokens(ctx.seed), "zoo-tied-to-device", lm_loss)


FACTORIES = {
    "vit": make_vit,
    "encoder": make_encoder,
    "hf_gpt2": make_hf_gpt2,
    "hf_bert": make_hf_bert,
    "lstm": make_lstm,
    "gru": make_gru,
    "cnn_bn": make_cnn_bn,
    "dw_separable": make_dw_separable,
    "tied": make_tied,
    "unused": make_unused,
    "root_computes": make_root_computes,
    "unet": make_unet,
    "hf_llama": make_hf_llama,
    "moe": make_moe,
    "root_exp": make_root_exp,
    "tied_to_device": make_tied_to_device,
}
"""Each zoo model by its short name."""
