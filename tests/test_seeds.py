"""Seeds trained together (one compiled step: vmapped or unrolled) against separate runs, their resume, and
the sweep's grid and table."""

import glob
import json
import os
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import tiny_config

import symjax
import symjax.configs as configs
from symjax import model as model_lib
from symjax import tasks
from symjax.run import workdir as rundir
from symjax.train import config as config_lib
from symjax.train import optim, seeds, sweep
from symjax.train import trainer as train

pytestmark = pytest.mark.slow  # end to end: every test here trains or runs a command

STEPS = 20


def tiny(**overrides):
  config = tiny_config(total_steps=STEPS, **overrides)
  config.model.dropout_rate = 0.1   # dropout keys must follow each seed too
  return config


def max_difference(a, b):
  return max(float(np.abs(np.asarray(x) - np.asarray(y)).max()) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.fixture(scope='module')
def together(tmp_path_factory):
  root = tmp_path_factory.mktemp('seeds')
  folders = [str(root / f'seed_{s}') for s in (0, 1)]
  finals = seeds.train_seeds(tiny(), [0, 1], folders, verbose=False)
  return root, folders, finals


def test_vmapped_seeds_equal_separate_runs(together, tmp_path):
  _, folders, finals = together
  for seed, folder, final in zip((0, 1), folders, finals):
    alone = train.train_and_evaluate(tiny(seed=seed), str(tmp_path / f'alone_{seed}'))
    assert max_difference(symjax.load(folder).params, symjax.load(str(tmp_path / f'alone_{seed}')).params) < 1e-5
    for split in ('validation', 'test'):
      assert final[split]['loss'] == pytest.approx(alone[split]['loss'], rel=1e-5)
  # The seeds really differ (initialisation, data order, dropout).
  assert max_difference(symjax.load(folders[0]).params, symjax.load(folders[1]).params) > 1e-3
  with open(os.path.join(folders[1], rundir.CONFIG_FILE)) as f:
    assert json.load(f)['seed'] == 1


def test_finished_seeds_are_not_trained_again(together, monkeypatch):
  _, folders, finals = together
  from symjax import tasks
  monkeypatch.setattr(tasks, 'get_task', lambda *a, **k: pytest.fail('a finished run was trained again'))
  assert seeds.train_seeds(tiny(), [0, 1], folders, verbose=False) == finals


def unfinished_copies(folders, tmp_path) -> list[str]:
  """Copies of finished seed folders without their final metrics, so that a rerun resumes them."""
  copies = [str(tmp_path / os.path.basename(f)) for f in folders]
  for src, dst in zip(folders, copies):
    shutil.copytree(src, dst)
    os.remove(os.path.join(dst, seeds.FINAL_FILE))
  return copies


def test_resume_starts_from_the_newest_step_every_seed_has(together, tmp_path):
  _, folders, _ = together
  copies = unfinished_copies(folders, tmp_path)
  shutil.rmtree(os.path.join(copies[1], rundir.CHECKPOINT_DIR, str(STEPS)))   # seed 1 stopped at step 10
  seeds.train_seeds(tiny(), [0, 1], copies, verbose=False)
  for src, dst in zip(folders, copies):
    assert max_difference(symjax.load(src).params, symjax.load(dst).params) < 1e-6
  with open(os.path.join(copies[1], rundir.METRICS_FILE)) as f:
    assert any(json.loads(line)['step'] == STEPS for line in f)


def test_a_corrupt_step_of_one_seed_falls_back_to_an_earlier_common_step(together, tmp_path, capsys):
  _, folders, _ = together
  copies = unfinished_copies(folders, tmp_path)
  for path in glob.glob(os.path.join(copies[1], rundir.CHECKPOINT_DIR, str(STEPS), 'default', '**', '*'),
                        recursive=True):
    if os.path.isfile(path):
      with open(path, 'wb') as f:
        f.write(b'not a checkpoint')
  seeds.train_seeds(tiny(), [0, 1], copies, verbose=False)
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(f'WARNING: checkpoint at step {STEPS} is corrupt or partial')
  assert err[0].endswith('trying step 10') and 'seed_1' in err[0], err
  assert os.listdir(os.path.join(copies[1], rundir.CORRUPT_DIR))[0].startswith(f'{STEPS}_')
  assert not os.path.exists(os.path.join(copies[0], rundir.CORRUPT_DIR))
  for src, dst in zip(folders, copies):
    assert max_difference(symjax.load(src).params, symjax.load(dst).params) < 1e-6


def test_seeds_refuse_a_resume_that_cannot_continue_their_checkpoints(together, tmp_path):
  _, folders, _ = together
  copies = unfinished_copies(folders, tmp_path)
  before = [sorted(os.listdir(os.path.join(c, rundir.CHECKPOINT_DIR))) for c in copies]
  configs = [open(os.path.join(c, rundir.CONFIG_FILE)).read() for c in copies]
  with pytest.raises(ValueError, match=r'optimiser state .*grad_clip_norm: 1\.0 -> 0\.0'):
    seeds.train_seeds(tiny(grad_clip_norm=0.0), [0, 1], copies, verbose=False)
  assert [sorted(os.listdir(os.path.join(c, rundir.CHECKPOINT_DIR))) for c in copies] == before
  assert [open(os.path.join(c, rundir.CONFIG_FILE)).read() for c in copies] == configs
  assert not any(os.path.exists(os.path.join(c, 'checkpoints_corrupt')) for c in copies)


def test_seeds_refuse_what_they_cannot_do(tmp_path):
  with pytest.raises(ValueError, match='config.stop_at_accuracy must be 0 when seeds train together'):
    seeds.train_seeds(tiny(stop_at_accuracy=0.9), [0], [str(tmp_path / 'a')])
  with pytest.raises(ValueError, match='one work directory per seed'):
    seeds.train_seeds(tiny(), [0, 1], [str(tmp_path / 'a')])


def test_seeds_start_from_position_and_symbol_counts_as_a_single_run_does(tmp_path, monkeypatch):
  """model.position_counts and model.symbol_counts: every seed's fresh state has layer 0's first three numerical
  heads set to the counts (the predicates k >= q, k <= q and always, read over positions) and the next five each
  counting one of reverse's symbols (the key a token, k == that token's id), the rest of each seed's
  initialisation its own."""
  from symjax.model import transformer_program as tp
  from symjax.tasks import rasp
  config = configs.from_file('rasp:task=reverse,model=program,runlocal=true')
  config.model.num_heads, config.model.numerical_heads, config.model.position_counts = 4, 3, True
  config.model.symbol_counts = True
  config.total_steps, config.warmup_steps, config.progress_bar = 2, 1, False
  seen = {}
  monkeypatch.setattr(train, 'train_seats', lambda config, s, seats, *a, **k: seen.update(s=s, seats=seats))
  seeds.train_seeds(config, [0, 1], [str(tmp_path / 'a'), str(tmp_path / 'b')], verbose=False)
  cfg, params = seen['s'].model_config, seen['seats'].state.params
  card, reads = tp.cardinality(cfg), tp.head_reads(cfg, 0, numerical=True)
  q, k = np.indices((card, card))
  for h, holds in zip((1, 2, 3), (k >= q, k <= q, np.ones((card, card), bool))):
    head = params[f'attn_0_{h}']
    for i in range(2):
      np.testing.assert_array_equal(np.asarray(head['predicate'][i]) > 0, holds)
      chosen = {int(np.argmax(head[f'select_{side}'][i])) for side in ('query', 'key')}
      assert chosen == {reads.index('positions')}, chosen
  tokens = list(rasp.vocab('reverse').tokens)
  for (l, h), symbol in zip([(1, 1), (1, 2), (1, 3), (2, 1), (2, 2)], rasp.symbols('reverse'), strict=True):
    head, reads = params[f'attn_{l}_{h}'], tp.head_reads(cfg, l, numerical=True)
    for i in range(2):
      np.testing.assert_array_equal(np.asarray(head['predicate'][i]) > 0, k == tokens.index(symbol))
      assert int(np.argmax(head['select_key'][i])) == reads.index('tokens')
  assert max_difference(params['attn_2_3']['predicate'][0], params['attn_2_3']['predicate'][1]) > 1e-3
  assert max_difference(params['attn_0_0']['predicate'][0], params['attn_0_0']['predicate'][1]) > 1e-3


@pytest.mark.parametrize('spec, message', [
    ('learnig_rate=1e-3', r"--grid field 'learnig_rate' is not a config field; fields: adam_b1, .*learning_rate"),
    ('model.tau=1', r"--grid field 'model.tau' is not a config field; fields of model: .*tau_init"),
    ('learning_rate=fast', r"--grid learning_rate: 'fast' is not a number \(float\)"),
    ('batch_size=1.5', r"--grid batch_size: '1.5' is not an integer"),
    ('learning_rate=', r'--grid learning_rate: empty value'),
    ('model=1', r"--grid field 'model' is a group of fields"),
    ('learning_rate', r"--grid 'learning_rate' is not field=value1,value2"),
])
def test_bad_grid_is_a_clear_error(spec, message):
  with pytest.raises(ValueError, match=message):
    sweep.parse_grid(tiny(), [spec])


def test_grid_values_take_the_fields_types():
  grid = sweep.parse_grid(tiny(), ['learning_rate=1e-3,0.01', 'batch_size=8', 'model.symbolic_layers=0:1,1',
                                   'model.learned_slopes=false', 'model.dtype=bfloat16'])
  assert grid == [('learning_rate', [1e-3, 0.01]), ('batch_size', [8]), ('model.symbolic_layers', [(0, 1), (1,)]),
                  ('model.learned_slopes', [False]), ('model.dtype', ['bfloat16'])]
  point = dict((f, v[0]) for f, v in grid)
  config = sweep.apply(tiny(), point)
  assert config.model.symbolic_layers == (0, 1) and config.batch_size == 8 and not config.model.learned_slopes
  assert sweep.point_name(point) == ('learning_rate=0.001,batch_size=8,model.symbolic_layers=0:1,'
                                     'model.learned_slopes=False,model.dtype=bfloat16')


def test_a_grid_point_moves_the_fields_that_follow_it_as_the_command_line_does():
  """The text recipe's model.max_len is four times seq_len by reference (the reference the recipe sets)."""
  text = configs.from_file('standard:task=text')
  assert sweep.apply(text, {'seq_len': 128}).model.max_len == 512
  assert sweep.apply(text, {'seq_len': 128, 'model.max_len': 200}).model.max_len == 200
  assert (text.seq_len, text.model.max_len) == (64, 256)  # the swept config is a copy


def test_interval_is_students_t():
  mean, half = sweep.interval([1.0, 2.0, 3.0])
  assert mean == 2.0 and half == pytest.approx(4.302653 / np.sqrt(3), rel=1e-6)   # t(0.975, 2) = 4.3027
  assert sweep.interval([5.0]) == (5.0, 0.0)


def test_invalid_grid_point_is_refused_before_anything_trains(tmp_path):
  with pytest.raises(ValueError, match=r'grid point model.tau_init=-1.0: model.tau_init must be > 0'):
    sweep.run(tiny(), ['model.tau_init=1,-1'], 2, str(tmp_path))
  assert not os.listdir(tmp_path)


def test_sweep_table_reports_test_for_the_chosen_point_only(together):
  root, _, _ = together
  # A grid point whose folders are the trained seeds (symlinked): the sweep trains nothing, only tabulates.
  os.makedirs(root / 'sweep', exist_ok=True)
  os.symlink(root, root / 'sweep' / 'total_steps=20', target_is_directory=True)
  summary = sweep.run(tiny(), ['total_steps=20'], 2, str(root / 'sweep'), command='test')
  row, = summary['rows']
  values = row['validation/loss']['values']
  assert len(values) == 2 and row['validation/loss']['mean'] == pytest.approx(np.mean(values))
  assert summary['chosen']['name'] == 'total_steps=20' and len(summary['chosen']['test/loss']['values']) == 2
  assert not any(k.startswith('test/') for k in row)
  assert (root / 'sweep' / 'sweep.md').read_text().count('test/loss') == 1


def test_unrolled_and_vmapped_seed_steps_agree():
  config = tiny()
  task = tasks.get_task(config)
  model = model_lib.build(config_lib.model_config(config, len(task.vocab), task.causal))
  tx = optim.make_optimizer(config)
  train_step, _ = train.make_steps(model, tx, train.StepOptions.of(config))
  keys = jnp.stack([jax.random.key(s) for s in (0, 1)])
  init = jax.jit(jax.vmap(lambda k: nn.meta.unbox(optim.init_state(model, tx, k, task.seq_len))))
  batch = jax.tree.map(lambda *xs: np.stack(xs), *[task.batch('train', 0, config.batch_size, s) for s in (0, 1)])
  results = {how: seeds.combined_step(train_step, 2, how)(init(keys), batch, keys) for how in ('vmap', 'unroll')}
  assert max_difference(results['vmap'], results['unroll']) < 1e-5
  assert max_difference(*[jax.tree.map(lambda x: x[i], results['unroll'][0].params) for i in (0, 1)]) > 1e-3
  with pytest.raises(ValueError, match="seed step must be one of"):
    seeds.combined_step(train_step, 2, 'pmap')
