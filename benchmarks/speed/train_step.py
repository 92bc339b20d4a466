"""Compiled memory of one whole training step at the paper's size, for every model kind; with ``--counts``,
the kinds' parameter counts instead.

  python -m benchmarks.speed.train_step [--json=train_step.json] [--layers=12]
  python -m benchmarks.speed.train_step --counts [--counts_json=param_counts.json]

The 12-layer model of "Symbolic Transformers" §6.1 (H = 12, d_head = 64, |V| = 50,257, FFN width 3072,
VocabFFN 256 per channel), batch 1 × 2048 tokens, AdamW, float32. XLA's memory analysis of the compiled
step (forward, backward, optimizer update; the state donated) — nothing is allocated or run. "peak" is
arguments + outputs − donated aliases + temporaries.

``--counts``: parameter counts from shapes alone (``jax.eval_shape``: nothing allocated) at two sizes, a
small one and "paper", the typical configuration of "Symbolic Transformers" §6.1 (12 layers, H = 12,
d_head = 64, |V| = 50,257) with FFN width 4·d_model (VocabFFN: 4·d_head per channel, the same total width)
and context 2048; a Markdown table, and JSON.
"""


import jax
import jax.numpy as jnp
from absl import app, flags

from benchmarks.lib import cli, recipe
from benchmarks.lib import results as result_files
from symjax.model import ModelConfig, Transformer, count_params, param_shapes
from symjax.train import config as config_lib
from symjax.train import optim
from symjax.train import trainer as train

_JSON = cli.json_output('train_step.json')
_LAYERS = flags.DEFINE_integer('layers', 12, 'Number of layers.')
_TOKENS = flags.DEFINE_integer('tokens', 2048, 'Sequence length (batch 1).')
_CHUNK = flags.DEFINE_integer('chunk', 1024, 'Vocabulary rows per streamed step.')
_COUNTS = flags.DEFINE_bool('counts', False, 'Parameter counts of the kinds from shapes alone, instead.')
_COUNTS_JSON = flags.DEFINE_string('counts_json', 'param_counts.json', 'Where --counts writes.')

VOCAB = 50257
VARIANTS = {
    'standard (direct readout)': dict(kind='standard', readout='direct'),
    'standard': dict(kind='standard'),
    'token_factored': dict(kind='token_factored'),
    'symbolic (direct projection)': dict(kind='symbolic', vocab_projection='direct'),
    'symbolic (streamed projection)': dict(kind='symbolic', vocab_projection='streamed'),
}


def step_memory(kind: str, vocab_projection: str = 'direct', readout: str = 'streamed') -> dict:
  config = config_lib.default_config(kind, 'paper')
  config.model.num_layers = _LAYERS.value
  config.model.max_len = _TOKENS.value
  config.model.vocab_projection = vocab_projection
  config.model.vocab_chunk_size = _CHUNK.value
  config.readout = readout
  config.batch_size = 1
  model_config = config_lib.model_config(config, VOCAB, causal=True)
  mesh = jax.make_mesh((1, 1), ('data', 'vocab'), devices=jax.devices()[:1],
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  with jax.set_mesh(mesh):
    model = Transformer(model_config)
    rng = jax.random.key(0)
    run = train.compile_run(model, optim.make_optimizer(config), recipe.text_options(config), rng, mesh, (),
                            _TOKENS.value)
    tokens = jax.ShapeDtypeStruct((1, _TOKENS.value), jnp.int32)
    batch = {'inputs': tokens, 'targets': tokens, 'weights': jax.ShapeDtypeStruct(tokens.shape, jnp.float32),
             'key_mask': jax.ShapeDtypeStruct(tokens.shape, jnp.bool_)}
    analysis = run.train_step.lower(run.abstract_state, batch).compile().memory_analysis()
  out = {k: int(getattr(analysis, f'{k}_size_in_bytes')) for k in ('argument', 'output', 'alias', 'temp')}
  out['peak'] = out['argument'] + out['output'] - out['alias'] + out['temp']
  out['parameters'] = sum(x.size for x in jax.tree.leaves(run.abstract_state.params))
  return out


SIZES = {
    'small': ModelConfig.of(vocab_size=16, num_layers=2, num_heads=4, head_dim=16, ff_dim=256,
                         ff_dim_per_head=64, max_len=64),
    'paper': ModelConfig.of(vocab_size=50257, num_layers=12, num_heads=12, head_dim=64, ff_dim=3072,
                         ff_dim_per_head=256, max_len=2048),
}
COUNTED = {
    'standard (learned positions)': dict(kind='standard', positions='learned'),
    'standard (ALiBi)': dict(kind='standard', positions='alibi'),
    'token_factored': dict(kind='token_factored'),
    'symbolic': dict(kind='symbolic'),
}


def breakdown(config):
  params = param_shapes(config)
  embed = params['embed']['embedding'].size
  total = count_params(config)
  value_map = sum(params[f'layer_{l}']['value_map']['w_head'].size
                  for l in range(config.num_layers) if 'value_map' in params[f'layer_{l}'])
  return {'total': total, 'embedding': int(embed), 'non_embedding': int(total - embed),
          'value_map': int(value_map)}


def counts() -> None:
  """The parameter counts table and JSON (``--counts``)."""
  rows = []
  for size, base in SIZES.items():
    for name, change in COUNTED.items():
      counts = breakdown(base.replace(**change))
      rows.append({'size': size, 'model': name, **counts})
  print('| size | model | total | embedding | non-embedding | value map (all layers) |')
  print('|---|---|---:|---:|---:|---:|')
  for r in rows:
    print(f"| {r['size']} | {r['model']} | {r['total']:,} | {r['embedding']:,} | {r['non_embedding']:,} "
          f"| {r['value_map']:,} |")
  result_files.write(_COUNTS_JSON.value, {'sizes': {k: v.flat() for k, v in SIZES.items()}, 'rows': rows})
  print(f'wrote {_COUNTS_JSON.value}')



def main(_):
  if _COUNTS.value:
    return counts()
  gib = lambda b: b / 2**30
  rows = {}
  for name, variant in VARIANTS.items():
    rows[name] = step_memory(**variant)
    print(f'{name}: peak {gib(rows[name]["peak"]):.2f} GiB', flush=True)
  print(f'\nOne training step, {_LAYERS.value} layers, batch 1 × {_TOKENS.value}, |V| = {VOCAB:,} '
        f'(loss streamed unless marked direct; chunk {_CHUNK.value})')
  print('| model | parameters | state (args) | temporaries | peak | fits 80 GB |')
  print('|---|---:|---:|---:|---:|:---:|')
  for name, r in rows.items():
    print(f"| {name} | {r['parameters']:,} | {gib(r['argument']):.2f} GiB | {gib(r['temp']):.2f} GiB | "
          f"{gib(r['peak']):.2f} GiB | {'yes' if r['peak'] <= 80e9 else 'no'} |")
  ratio = rows['symbolic (streamed projection)']['peak'] / rows['token_factored']['peak']
  print(f'symbolic (streamed) / token_factored peak = {ratio:.2f}')
  result_files.write(_JSON.value, {'layers': _LAYERS.value, 'tokens': _TOKENS.value, 'vocab': VOCAB, 'chunk': _CHUNK.value,  # noqa: E501
               'rows': rows, 'symbolic_streamed_over_token_factored': ratio})
  print(f'wrote {_JSON.value}')


if __name__ == '__main__':
  app.run(main)
