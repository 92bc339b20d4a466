"""Parameter counts of the three model kinds, from shapes alone (``jax.eval_shape``: nothing allocated).

  python -m benchmarks.analysis.param_counts [--json=param_counts.json]

Prints a Markdown table and writes JSON. "paper" is the typical configuration of "Symbolic Transformers"
§6.1 (12 layers, H = 12, d_head = 64, |V| = 50,257), with FFN width 4·d_model (VocabFFN: 4·d_head per
channel, the same total width) and context 2048.
"""


from absl import app

from benchmarks.lib import cli
from benchmarks.lib import results as result_files
from symjax.model import ModelConfig, count_params, param_shapes

_JSON = cli.json_output('param_counts.json')

SIZES = {
    'small': ModelConfig.of(vocab_size=16, num_layers=2, num_heads=4, head_dim=16, ff_dim=256,
                         ff_dim_per_head=64, max_len=64),
    'paper': ModelConfig.of(vocab_size=50257, num_layers=12, num_heads=12, head_dim=64, ff_dim=3072,
                         ff_dim_per_head=256, max_len=2048),
}
VARIANTS = {
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


def main(_):
  rows = []
  for size, base in SIZES.items():
    for name, change in VARIANTS.items():
      counts = breakdown(base.replace(**change))
      rows.append({'size': size, 'model': name, **counts})
  print('| size | model | total | embedding | non-embedding | value map (all layers) |')
  print('|---|---|---:|---:|---:|---:|')
  for r in rows:
    print(f"| {r['size']} | {r['model']} | {r['total']:,} | {r['embedding']:,} | {r['non_embedding']:,} "
          f"| {r['value_map']:,} |")
  result_files.write(_JSON.value, {'sizes': {k: v.flat() for k, v in SIZES.items()}, 'rows': rows})
  print(f'wrote {_JSON.value}')


if __name__ == '__main__':
  app.run(main)
