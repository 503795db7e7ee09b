"""The reference workload's model and data (examples/pytorch/train.py imports them).

A GPT-style decoder-only transformer whose pipeline stages and interleaved chunks keep
the global layer numbers in their parameter names (so a checkpoint reads back at any
plan), with selective recompute of the attention core and sequence parallelism's
redistribution of the residual stream; and the seeded synthetic batches that every plan
sees alike.  torch is imported inside the functions: train.py answers --help and checks
its plan before torch loads.
"""


def build_model_classes():
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Attention(nn.Module):
        def __init__(self, hidden, heads):
            super().__init__()
            self.head_dim = hidden // heads
            self.q = nn.Linear(hidden, hidden)
            self.k = nn.Linear(hidden, hidden)
            self.v = nn.Linear(hidden, hidden)
            self.o = nn.Linear(hidden, hidden)
            self.selective = False  # recompute the attention core in the backward

        def forward(self, x):
            b, t, _ = x.shape
            # -1 heads: with tensor parallelism each rank holds heads/tp of them
            q, k, v = (lin(x).view(b, t, -1, self.head_dim).transpose(1, 2)
                       for lin in (self.q, self.k, self.v))
            if self.selective and torch.is_grad_enabled():
                y = torch.utils.checkpoint.checkpoint(F.scaled_dot_product_attention, q, k, v,
                                                      is_causal=True, use_reentrant=False)
            else:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o(y.transpose(1, 2).reshape(b, t, -1))

    class Mlp(nn.Module):
        def __init__(self, hidden):
            super().__init__()
            self.fc1 = nn.Linear(hidden, 4 * hidden)
            self.fc2 = nn.Linear(4 * hidden, hidden)

        def forward(self, x):
            return self.fc2(F.gelu(self.fc1(x)))

    class Block(nn.Module):
        def __init__(self, hidden, heads):
            super().__init__()
            self.ln1 = nn.LayerNorm(hidden)
            self.attn = Attention(hidden, heads)
            self.ln2 = nn.LayerNorm(hidden)
            self.mlp = Mlp(hidden)

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        """Decoder-only transformer.  A pipeline stage keeps only its blocks
        (ModuleDict keys stay the global layer numbers, so parameter names are
        the same at every plan) and the embeddings / head when first / last."""

        def __init__(self, cfg):
            super().__init__()
            self.tok_emb = nn.Embedding(cfg["vocab"], cfg["hidden"])
            self.pos_emb = nn.Embedding(cfg["seq_len"], cfg["hidden"])
            self.layers = nn.ModuleDict({str(i): Block(cfg["hidden"], cfg["heads"])
                                         for i in range(cfg["layers"])})
            self.ln_f = nn.LayerNorm(cfg["hidden"])
            self.head = nn.Linear(cfg["hidden"], cfg["vocab"], bias=False)
            self.checkpointing = False
            # Sequence parallelism: the TP mesh the residual stream is sharded over.
            self.sp_mesh = None

        def chunk(self, layer_ids, first, last):
            """A view of some of this module's layers (an interleaved pipeline's
            chunk): the same parameters, with the embeddings / head when first / last."""
            view = GPT.__new__(GPT)
            nn.Module.__init__(view)
            view.layers = nn.ModuleDict({i: m for i, m in self.layers.items() if int(i) in layer_ids})
            view.tok_emb = self.tok_emb if first else None
            view.pos_emb = self.pos_emb if first else None
            view.ln_f = self.ln_f if last else None
            view.head = self.head if last else None
            view.checkpointing, view.sp_mesh = self.checkpointing, self.sp_mesh
            return view

        def keep_stage(self, layer_ids, first, last):
            for i in list(self.layers.keys()):
                if int(i) not in layer_ids:
                    del self.layers[i]
            if not first:
                self.tok_emb = None
                self.pos_emb = None
            if not last:
                self.ln_f = None
                self.head = None

        def forward(self, x):
            if self.tok_emb is not None:
                pos = torch.arange(x.shape[1], device=x.device)
                x = self.tok_emb(x) + self.pos_emb(pos)
                if self.sp_mesh is not None:  # each TP rank keeps its part of the sequence
                    x = redistribute(x, self.sp_mesh, Replicate(), Shard(1))
            for layer in self.layers.values():
                if self.checkpointing and torch.is_grad_enabled():
                    x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
                else:
                    x = layer(x)
            if self.head is not None:
                if self.sp_mesh is not None:
                    x = redistribute(x, self.sp_mesh, Shard(1), Replicate())
                x = self.head(self.ln_f(x))
            return x

    from torch.distributed.tensor import DTensor, Replicate, Shard

    def redistribute(x, mesh, source, target):
        """A local tensor laid out as `source` over `mesh`, as `target` (its backward
        the converse: the embeddings' gradient whole on every rank)."""
        return DTensor.from_local(x, mesh, [source], run_check=False).redistribute(mesh, [target]).to_local()

    return GPT


def synthetic_batch(seed, iteration, rows, seq_len, vocab):
    """The global batch of one iteration: `rows` sequences of seq_len+1 tokens
    following x[t+1] = 5*x[t]+3 mod vocab from a random start, 10% of the
    tokens replaced by random ones.  Depends only on (seed, iteration), so
    any plan sees the same data."""
    import torch
    g = torch.Generator().manual_seed(seed * 1_000_003 + iteration)
    seq = torch.empty(rows, seq_len + 1, dtype=torch.long)
    seq[:, 0] = torch.randint(vocab, (rows,), generator=g)
    for t in range(1, seq_len + 1):
        seq[:, t] = (seq[:, t - 1] * 5 + 3) % vocab
    noise = torch.rand(rows, seq_len + 1, generator=g) < 0.1
    seq[noise] = torch.randint(vocab, (int(noise.sum()),), generator=g)
    return seq
