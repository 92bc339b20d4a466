"""The dual-stream family ("The Dual-Stream Transformer", Kerce & Fox 2026, and its companions on per-layer
supervision and stream independence), by the family's own names ``{attn}-{ffn}_{stream}[_{gate}][_pls[_xe]]``:

  python -m symjax.main --config=dual_stream:variant=kron-dns_T              # the recommended mixing
  python -m symjax.main --config=dual_stream:variant=dns-dns_C_G,task=text,size=medium --config.text_path=input.txt

- attn: the attention's head mixing at its value and output maps — ``dns`` (dense), ``ind`` (independent:
  no channel reaches another head), ``kron`` (W ⊗ I: heads exchange scalars, each feature from itself).
- ffn: ``dns`` (one MLP over the state) or ``ind`` (one MLP per channel).
- stream: ``T`` (token-factored: attention writes X_t, the FFN X_e), ``C`` (CASCADE: X_t stays the embedding
  and both write X_e) or ``S`` (single: both write one stream).
- gate: ``G`` (gated attention reading the query) or ``Gs`` (reading the channel LayerNorm of X_t).
- ``pls``: per-layer supervision (weight ``pls_weight``, decay ``pls_decay``), decoding X_t + X_e, or X_e
  with ``_xe``. A ``cascade`` part means the CASCADE stream: the family's ``dns-dns_S_G_cascade_pls_xe`` is
  read as ``dns-dns_C_G_pls_xe`` (its one updated stream is X_e, X_t frozen), and ``T`` with ``cascade`` is
  an error.

Other arguments after ':': task=induction|text, size=tiny|small|medium|paper, runlocal=true,
positions=rope|alibi (the family's default RoPE), pls_weight, pls_decay=linear|exponential|uniform|linear_final.
The model is kind 'token_factored' with channel LayerNorms, so every variant is the Token-Factored
Transformer's code with fields changed (``symjax/model/config.py``, group ``streams``). Results: the docs'
"Dual-stream family" page.
"""

from symjax.configs import common
from symjax.system.errors import InputError

KIND = 'token_factored'
ATTENTION = {'dns': ('dense', 'dense'), 'ind': ('independent', 'independent'),
             'kron': ('kronecker_identity', 'kronecker')}           # (value_map, head_mixing)
FFN = {'dns': 'dense', 'ind': 'independent'}
STREAMS = {'T': 'token_factored', 'C': 'cascade', 'S': 'single'}
GATES = {'G': 'combined', 'Gs': 'symbolic'}
GRAMMAR = ('{attn}-{ffn}_{stream}[_{gate}][_cascade][_pls[_xe]] with attn in dns|ind|kron, ffn in dns|ind, '
           'stream in T|C|S, gate in G|Gs')


def variant_fields(variant: str) -> dict:
  """The model fields a variant name sets; InputError naming the grammar for any other name."""
  def bad(why):
    return InputError(f'dual_stream variant {variant!r}: {why}; names are {GRAMMAR} (e.g. kron-dns_C_G)')

  head, _, rest = variant.partition('_')
  attn, _, ffn = head.partition('-')
  if attn not in ATTENTION or ffn not in FFN:
    raise bad(f'the mixing part {head!r} is not {{attn}}-{{ffn}}')
  parts = rest.split('_') if rest else []
  if not parts or parts[0] not in STREAMS:
    raise bad('the stream (T, C or S) is missing after the mixings')
  stream, parts = STREAMS[parts[0]], parts[1:]
  gate = GATES[parts.pop(0)] if parts and parts[0] in GATES else 'none'
  if parts and parts[0] == 'cascade':
    if stream == 'token_factored':
      raise bad('T (attention writes X_t) and cascade (X_t frozen) contradict each other')
    stream, parts = 'cascade', parts[1:]
  pls = bool(parts) and parts[0] == 'pls'
  parts = parts[1:] if pls else parts
  source = 'x_e' if pls and parts and parts[0] == 'xe' else 'x'
  parts = parts[1:] if source == 'x_e' else parts
  if parts:
    raise bad(f'{"_".join(parts)!r} is not a part of the grammar here')
  value_map, head_mixing = ATTENTION[attn]
  return dict(value_map=value_map, head_mixing=head_mixing, ffn_mixing=FFN[ffn], stream=stream, gate=gate,
              pls=pls, pls_source=source)


def get_config(arg=None):
  config, a = common.base(KIND, arg, variant='kron-dns_T', positions='rope', pls_weight=0.5, pls_decay='linear')
  fields = variant_fields(a.variant)
  m = config.model
  m.value_map, m.head_mixing, m.ffn_mixing = fields['value_map'], fields['head_mixing'], fields['ffn_mixing']
  m.stream, m.gate = fields['stream'], fields['gate']
  m.channel_norm = True              # the family's blocks read channel LayerNorms (CLN) of X_t + X_e
  m.positions = a.positions          # the family's default is RoPE; ALiBi is the Symbolic Transformer's
  m.pls_weight = a.pls_weight if fields['pls'] else 0.0
  m.pls_decay, m.pls_source = a.pls_decay, fields['pls_source']
  # The Token-Factored recipe's scale and text tuning, so that the family compares with it on equal terms:
  # X_t starts as the embedding, whose scale is that of every value the heads move.
  m.embed_init_std = 0.25
  common.task(config, a.task, text_learning_rate=3e-3, text_tied=False)
  return common.finish(config, a)
