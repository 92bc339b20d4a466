"""Every benchmark script says, under --help, what it measures (its docstring) and where it writes."""

import glob
import os
import subprocess
import sys

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


def test_profiles_charge_each_op_to_its_pass_and_part():
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


def test_profiles_read_products_and_metadata_from_hlo_text():
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


def test_ab_rounds_put_each_side_first_and_early_alike():
  from benchmarks.lib.timing import in_turn, round_ratios
  order = [side for r in range(4) for side in in_turn(('a', 'b'), r)]
  assert order == ['a', 'b', 'b', 'a', 'a', 'b', 'b', 'a']
  # Each side sits as early on average, so a steady drift of the machine weighs on both alike.
  assert sum(i for i, s in enumerate(order) if s == 'a') == sum(i for i, s in enumerate(order) if s == 'b')
  assert round_ratios([2.0, 3.0], [4.0, 1.5]) == [0.5, 2.0]
