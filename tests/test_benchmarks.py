"""Every benchmark script says, under --help, what it measures (its docstring) and where it writes."""

import glob
import os
import subprocess
import sys
import time

import pytest
from helpers import REPO

pytestmark = pytest.mark.slow

SCRIPTS = sorted(os.path.relpath(p, REPO)[:-3].replace(os.sep, '.')
                 for folder in ('speed', 'suites', 'analysis')
                 for p in glob.glob(os.path.join(REPO, 'benchmarks', folder, '*.py')) if not p.endswith('__init__.py'))


def test_the_scripts_are_found():
  assert 'benchmarks.speed.throughput' in SCRIPTS and len(SCRIPTS) >= 15


@pytest.mark.parametrize('module', SCRIPTS + ['benchmarks.results_pages'])
def test_help_says_what_is_measured_and_where_it_writes(module):
  proc = subprocess.run([sys.executable, '-m', module, '--help'], cwd=REPO, capture_output=True, text=True,
                        timeout=120)
  text = proc.stdout + proc.stderr
  assert proc.returncode in (0, 1) and 'Traceback' not in text, text[-2000:]  # absl's --help exits with 1
  assert f'python -m {module}' in text, text[:1500]  # the usage line, from the module's docstring
  # Where it writes: its --json flag and default, or the docstring's own words.
  assert any(word in text for word in ('--json', 'writes', 'docs/results/')), text[:1500]


def test_core_latency_takes_the_slowest_sample_in_each_span():
  from benchmarks.speed import core_latency
  samples = [(10.0, 80.0), (10.5, 90.0), (11.2, 300.0), (11.8, 70.0), (12.9, 70.0)]
  assert core_latency.slowest_between(samples, [(10.0, 11.0), (11.0, 12.0), (12.0, 12.5), (12.5, 13.0)]) == [
      90.0, 300.0, None, 70.0]


def test_block_spread_with_cores_near_leaves_out_far_blocks_and_counts_them():
  from benchmarks.speed import vs_pytorch
  run = lambda ms, ns, steady=None: {'block_ms_per_step': ms, 'block_core_round_trip_ns': ns,
                                     'block_steady': steady or [True] * len(ms)}
  rounds = [{'runs': {'a': run([20.0, 20.0, 27.0, 21.0, 40.0], [80, 82, 300, 79, 81], [True] * 4 + [False]),
                      'b': run([10.0, 10.0], [75, None])}}]
  near = vs_pytorch.spread_with_cores_near(rounds, 'a')
  # 27 ms was measured with the cores far apart (300 > 2 × 75), 40 ms is an evaluation block: neither counts.
  assert near['steady_blocks_cores_far'] == 1 and near['steady_blocks_cores_near'] == 3
  assert near['far_above_ns'] == 150 and abs(near['worst_block_deviation'] - 0.05) < 1e-9
  assert near['step_ms'] == 20.0
  assert vs_pytorch.spread_with_cores_near([{'runs': {'a': run([20.0], [None])}}], 'a') is None


def test_speed_ratio_with_cores_near_compares_blocks_run_with_the_cores_near():
  from benchmarks.speed import vs_pytorch
  run = lambda ms, ns: {'block_ms_per_step': ms, 'block_core_round_trip_ns': ns, 'block_steady': [True] * len(ms)}
  # The peer ran mostly with its cores far (45 ms) and 36 ms with them near; the program 30 ms, near throughout.
  rounds = [{'runs': {'peer': run([36.0, 45.0, 46.0, 47.0], [55, 250, 260, 255]),
                      'a': run([30.0, 30.0, 30.0], [56, 54, 55])}},
            {'runs': {'peer': run([45.0], [250]), 'a': run([30.0], [55])}}]
  ratio = vs_pytorch.speed_ratio_with_cores_near(rounds, 'a', 'peer')
  assert ratio['per_round'] == [36.0 / 30.0]  # the second round: no near block of the peer's to compare with
  rounds[0]['runs']['a']['block_core_round_trip_ns'] = [None] * 3
  rounds[1]['runs']['peer']['block_core_round_trip_ns'] = [None]
  assert vs_pytorch.speed_ratio_with_cores_near(rounds, 'a', 'peer') is None


def test_core_latency_probe_samples_two_cpus(tmp_path):
  from benchmarks.speed import core_latency
  pair = core_latency.cpu_pair()
  if pair is None:
    pytest.skip('one CPU')
  binary, why = core_latency.build(str(tmp_path))
  if binary is None:
    pytest.skip(why)
  import select
  proc = subprocess.Popen([binary, *map(str, pair), '1'], stdout=subprocess.PIPE, text=True)
  rows, deadline = [], time.monotonic() + 60  # a deadline, not a timing: a probe that prints nothing fails
  try:
    while len(rows) < 3 and select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
      rows.append(proc.stdout.readline().split())
  finally:
    proc.kill()
    proc.wait()
  # Printed only when a batch ran undisturbed: a round trip of nanoseconds, never a descheduled batch's.
  assert len(rows) == 3 and all(len(r) == 2 and float(r[0]) > 1.6e9 and 0 < float(r[1]) < 1e4 for r in rows), rows
  # A CPU this process may not use is refused with a message, not measured.
  refused = subprocess.run([binary, str(pair[0]), str(max(os.sched_getaffinity(0)) + 1), '1'], capture_output=True,
                           text=True, timeout=60)
  assert refused.returncode == 2 and 'cannot run on CPU' in refused.stderr


def test_core_latency_monitor_without_a_probe_samples_nothing(tmp_path):
  from benchmarks.speed import core_latency
  with core_latency.Monitor(None, str(tmp_path / 'log')) as monitor:
    pass
  assert monitor.samples() == [] and core_latency.slowest_between([], [(0.0, 1.0)]) == [None]


def test_result_files_record_the_cpu_generation_not_only_its_name(tmp_path):
  import json
  import re

  from benchmarks.lib import results
  path = str(tmp_path / 'r.json')
  results.write(path, {'value': 1, 'cpu_id': 'stale', 'command': 'python -m x'})
  with open(path) as f:
    record = json.load(f)
  assert record['value'] == 1 and record['command'] == 'python -m x'
  assert record['cpu_id'] != 'stale'  # always this run's, like the commit
  assert record['cpu_id'] == 'unknown' or re.fullmatch(r'family \d+ model \d+ stepping (\d+|\?)', record['cpu_id'])


def test_step_attribution_charges_each_op_to_its_pass_and_part():
  from benchmarks.lib.profiling import classify
  root = 'jit(<lambda>)/'
  assert classify(root + 'transpose(jvp(Transformer))/layer_2/attention/out/dot_general') == ('backward', 'attention')
  assert classify(root + 'jvp(Transformer)/layer_0/ffn/wi/dot_general') == ('forward', 'FFN')
  # A LayerNorm's name holds its block's part ('norm_ffn'): it is a norm, not the FFN.
  assert classify(root + 'jvp(Transformer)/layer_0/norm_ffn/reduce_sum') == ('forward', 'norms')
  assert classify(root + 'transpose(jvp(Transformer))/layer_1/value_projection/dot_general') == (
      'backward', 'attention')
  assert classify(root + 'transpose(jvp(Transformer))/layer_1/add') == ('backward', 'residual adds and other')
  assert classify(root + 'jvp(nd,vd->nv)/dot_general') == ('forward', 'embedding and readout')
  assert classify(root + 'add') == ('update and metrics', 'optimizer and metrics')


def test_step_attribution_reads_products_and_metadata_from_hlo_text():
  from benchmarks.lib.profiling import hlo_ops
  wi, tanh = 'jit(f)/jvp(Transformer)/layer_0/ffn/wi/dot_general', 'jit(f)/jvp(Transformer)/layer_0/ffn/tanh'
  text = '\n'.join([
      '',
      '%fused_computation.1 (param_0: f32[8,4], param_1: f32[4,2]) -> f32[8,2] {',
      '  %param_0 = f32[8,4]{1,0} parameter(0)',
      '  %param_1 = f32[4,2]{1,0} parameter(1)',
      '  ROOT %dot.3 = f32[8,2]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}',
      '}',
      '',
      '%fused_computation.2 (param_0.1: f32[8,2]) -> f32[8,2] {',
      '  %param_0.1 = f32[8,2]{1,0} parameter(0)',
      '  ROOT %tanh.1 = f32[8,2]{1,0} tanh(%param_0.1)',
      '}',
      '',
      'ENTRY %main (p0: f32[8,4], p1: f32[4,2]) -> f32[8,1] {',
      '  %p0 = f32[8,4]{1,0} parameter(0)',
      '  %p1 = f32[4,2]{1,0} parameter(1)',
      '  %ynn_fusion = f32[8,2]{1,0} fusion(%p0, %p1), kind=kCustom, calls=%fused_computation.1, '
      f'metadata={{op_name="{wi}"}}',
      '  %tanh_fusion = f32[8,2]{1,0} fusion(%ynn_fusion), kind=kLoop, calls=%fused_computation.2, '
      f'metadata={{op_name="{tanh}"}}',
      '  ROOT %wrapped_reduce-window = f32[8,1]{1,0} fusion(%tanh_fusion), kind=kLoop, calls=%fused_computation.2',
      '}', ''])
  ops = hlo_ops(text)
  assert ops['ynn_fusion'] == (wi, True)  # a fusion that holds a dot is a product
  assert ops['tanh_fusion'] == (tanh, False)
  # No metadata of its own (a compiler pass made it): its operand's.
  assert ops['wrapped_reduce-window'] == (tanh, False)


def test_median_with_cores_near_leaves_out_rounds_run_with_the_cores_far():
  from benchmarks.speed.core_latency import median_with_cores_near
  rounds = [{'ms': 30.0, 'span_unix': (0.0, 1.0)}, {'ms': 45.0, 'span_unix': (1.0, 2.0)},
            {'ms': 32.0, 'span_unix': (2.0, 3.0)}]
  samples = [(0.5, 55.0), (1.5, 260.0), (2.5, 60.0)]
  near = median_with_cores_near([dict(r) for r in rounds], samples, limit=110.0)
  assert near == {'step_ms': 31.0, 'rounds_cores_near': 2}
  assert median_with_cores_near([dict(r) for r in rounds], samples, limit=None) == {'step_ms': 32.0}  # all


def test_part_costs_knockouts_take_each_part_out_and_put_it_back():
  import jax
  import optax
  from helpers import small

  from benchmarks.lib import knockouts
  from symjax.model import Transformer, attention
  from symjax.train import config as config_lib
  from symjax.train import optim, trainer
  cfg = small(kind='standard')
  tokens = jax.random.randint(jax.random.key(0), (2, 8), 0, cfg.vocab_size)
  originals = (attention.dot_product_attention, optim.make_optimizer, trainer.training_dynamics)

  def run():
    params = Transformer(cfg).init(jax.random.key(1), tokens)['params']
    return params, Transformer(cfg).apply({'params': params}, tokens)

  params, logits = run()
  for part, gone in (('attention core', None), ('FFN', 'ffn'), ('LayerNorms', 'norm_attn')):
    with knockouts.symjax_knockout(part):
      changed, changed_logits = run()
    assert not jax.numpy.allclose(changed_logits, logits), part
    if gone:  # the part's parameters are gone with it
      assert gone in params['layer_0'] and gone not in changed['layer_0'], part
  with knockouts.symjax_knockout('AdamW and metrics'):
    config = config_lib.from_file('standard:runlocal=true')
    assert type(optim.make_optimizer(config).init(params)) is type(optax.sgd(0.1).init(params))
    assert trainer.training_dynamics(params, params) == {}
  # Everything is back: the same functions, the same model.
  assert (attention.dot_product_attention, optim.make_optimizer, trainer.training_dynamics) == originals
  assert jax.numpy.array_equal(run()[1], logits)


def test_part_costs_pair_each_knockout_block_with_the_whole_step_beside_it():
  from benchmarks.lib import knockouts
  whole = [{'ms': 30.0, 'core_round_trip_ns': 60.0}, {'ms': 40.0, 'core_round_trip_ns': 300.0},
           {'ms': 32.0, 'core_round_trip_ns': 60.0}]
  ffn = [{'ms': 20.0, 'core_round_trip_ns': 60.0}, {'ms': 10.0, 'core_round_trip_ns': 60.0},
         {'ms': 21.0, 'core_round_trip_ns': 60.0}]
  out = knockouts.costs({knockouts.WHOLE: whole, 'FFN': ffn}, limit=120.0)
  # Block 1 ran with the cores far for the whole step: the pair is left out.
  assert out['step_ms'] == {knockouts.WHOLE: 31.0, 'FFN': 20.5}
  assert out['cost_ms'] == {'FFN': 10.5} and out['blocks_cores_near']['FFN'] == 2
  everything = knockouts.costs({knockouts.WHOLE: whole, 'FFN': ffn}, limit=None)  # one core: nothing to place
  assert everything['cost_ms'] == {'FFN': 11.0} and everything['blocks_cores_near']['FFN'] is None
  far = knockouts.costs({knockouts.WHOLE: whole, 'FFN': ffn}, limit=50.0)  # never near: every block, and 0 said
  assert far['cost_ms'] == {'FFN': 11.0} and far['blocks_cores_near']['FFN'] == 0


def test_part_costs_pytorch_block_without_knockout_is_torch_gpts():
  torch = pytest.importorskip('torch')
  from benchmarks.lib import knockouts
  from benchmarks.speed import torch_gpt
  torch.manual_seed(0)
  block = torch_gpt.Block(16, 2, 32)
  x = torch.randn(3, 5, 16)
  pos = torch.arange(5)
  distance, future = (pos[:, None] - pos[None, :]).abs().float(), pos[None, :] > pos[:, None]
  expected = block(x, distance, future)
  assert torch.allclose(knockouts.torch_block_forward(block, x, distance, future, None), expected)
  assert not torch.allclose(knockouts.torch_block_forward(block, x, distance, future, 'FFN'), expected)


