"""Model FLOPs of one forward pass per token, counted from the layer equations (shared by the benchmarks).

Multiply-adds × 2 of the matrix products only (norms, softmax and activations are not counted); causal
attention is counted in full, as in the PaLM paper's MFU. Training is 3 × forward.
"""


def products(cfg, seq_len: int) -> list[tuple[int, int, int, int, bool]]:
  """The matrix products of one forward pass over one sequence, as (b, m, k, n, per_sequence):
  [b, m, k] @ [b, k, n]. Over a batch of sequences, per_sequence products repeat b for each sequence
  (attention); the others stack the sequences' tokens into m."""
  d, h, dh, v, t = cfg.d_model, cfg.num_heads, cfg.head_dim, cfg.vocab_size, seq_len
  out = []
  for kind in cfg.layer_kinds():
    attention = [(h, t, dh, t, True), (h, t, t, dh, True)]                     # QKᵀ, weights · V
    if kind == 'standard':
      out += [(1, t, d, d, False)] * 4 + attention + [(1, t, d, cfg.ff_dim, False), (1, t, cfg.ff_dim, d, False)]
      continue
    out += [(1, t, d, d, False)] * 2 + [(1, t * dh, h, h, False)] + attention        # Q, K; W_head ⊗ I values; no O
    if kind == 'token_factored':
      out += [(1, t, d, cfg.ff_dim, False), (1, t, cfg.ff_dim, d, False)]
    else:
      f = cfg.symbolic.ff_dim_per_head
      projection = [(h, t, dh, v, False), (h, t, v, dh, False)]                  # z E^(h)ᵀ and α E^(h), per channel
      if cfg.symbolic_site('values'):
        out += projection
      if cfg.symbolic_site('ffn'):
        out += [(h, t, dh, f, False), (h, t, f, dh, False)] + projection
      else:
        out += [(1, t, d, cfg.ff_dim, False), (1, t, cfg.ff_dim, d, False)]
  return out + [(1, t, d, v, False)]                                       # readout


def forward_flops_per_token(cfg, seq_len: int) -> float:
  return sum(2 * b * m * k * n for b, m, k, n, _ in products(cfg, seq_len)) / seq_len
