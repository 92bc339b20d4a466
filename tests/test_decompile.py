"""Decompilation: a Symbolic Transformer as a program, exact where the model's mixtures and attention are
one-hot (program training, ``model.hard``), measurably unfaithful where they are spread."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import PROGRAM, PROGRAM_TOKENS, REPO, every_sequence, predict_with_numpy_alone, randomize, shapes_of

from symjax import model as model_lib
from symjax.model import intermediates as names
from symjax.proj import decompile
from symjax.system.errors import InputError

TOKENS = PROGRAM_TOKENS
CONFIG = PROGRAM


SETTINGS = {'causal': (True, False, 0, True), 'bidirectional': (False, False, 0, True),
            'bidirectional-qk_positions': (False, True, 0, True), 'causal-numerical': (True, False, 1, True),
            'bidirectional-qk_positions-numerical': (False, True, 2, True),
            'bidirectional-qk_positions-numerical_without': (False, True, 2, False)}


@pytest.fixture(scope='module', params=list(SETTINGS.values()), ids=list(SETTINGS))
def setting(request, tmp_path_factory):
  """Random parameters (every one away from its init), the program written from them, and the model in
  its hard (one-hot) and its soft (the paper's) form."""
  causal, positions, numerical, numerical_positions = request.param
  config = CONFIG.replace(causal=causal, qk_positions=positions, numerical_heads=numerical,
                               numerical_positions=numerical_positions)
  hard = config.replace(hard=True)
  # Draws chosen so that every setting's numerical heads select none, one and several keys in both layers
  # and every soft model's spread shows (fidelity below 99%).
  draw = 5 if numerical_positions else 4
  params = randomize(shapes_of(model_lib.build(config), jnp.zeros((1, 4), jnp.int32))['params'], draw)
  if numerical:  # gentle ALiBi slopes, so that the numerical heads read several keys as often as one or none
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: x.at[-numerical:].set(-3.0) if 'log_slope' in jax.tree_util.keystr(path) else x, params)
  path = str(tmp_path_factory.mktemp('program') / 'program.py')
  decompile.write(decompile.build(params, config, TOKENS), path)
  apply = lambda cfg: jax.jit(lambda x, real: model_lib.build(cfg).apply({'params': params}, x, real).argmax(-1))
  return decompile.load_program(path), apply(hard), apply(config), params, hard


def agreement(program, model, lengths=range(1, 6)):
  """The share of real positions where program and model agree, over every sequence of each length, padded
  to the longest: one batch, one compiled model, one program call."""
  width = max(lengths)
  rows = [np.pad(every_sequence(n), ((0, 0), (0, width - n))) for n in lengths]
  x, n = np.concatenate(rows), np.repeat(list(lengths), [len(r) for r in rows])
  real = np.arange(width) < n[:, None]
  predicted = np.asarray(model(x, real))
  return float((program.predict_ids(x, n) == predicted)[real].mean())


def test_the_program_of_a_one_hot_model_agrees_with_it_on_every_input(setting):
  program, hard, _, _, _ = setting
  assert agreement(program, hard) == 1.0  # every sequence of 1 to 5 tokens: 3,905 sequences
  with pytest.raises(ValueError, match=r'9 tokens; the model reads at most 8'):
    program.predict_ids(np.ones(9, np.int64))


def test_a_batch_of_unequal_lengths_gives_each_row_what_it_gives_alone(setting):
  program, hard, _, params, config = setting
  x = every_sequence(5)[::97]
  lengths = np.arange(len(x)) % 6                 # 0 to 5 real tokens, then padding (id 0)
  real = np.arange(5) < lengths[:, None]
  x = np.where(real, x, 0)
  batched = program.predict_ids(x, lengths)
  for row, n, tags in zip(x, lengths, batched):
    np.testing.assert_array_equal(tags[:n], program.predict_ids(row[:n]))
  np.testing.assert_array_equal(batched[~real], 0)  # padding is tagged 0
  model = model_lib.build(config).apply({'params': params}, jnp.asarray(x), jnp.asarray(real)).argmax(-1)
  np.testing.assert_array_equal(batched[real], np.asarray(model)[real])  # and the model, masked, agrees
  assert program.predict_ids(np.zeros((3, 0), np.int64)).shape == (3, 0)
  with pytest.raises(ValueError, match=r'lengths must be one count in 0\.\.5 per sequence \(\d+\)'):
    program.predict_ids(x, lengths + 1)


def test_the_program_of_a_spread_model_disagrees_with_it(setting):
  program, hard, soft, _, _ = setting
  fidelity = agreement(program, soft, lengths=[5])
  assert 0.0 < fidelity < 0.99, fidelity


def test_a_hard_model_mixes_one_token_and_reads_one_key_while_its_gradients_flow(setting):
  _, _, _, params, hard = setting
  model, x = model_lib.build(hard), jnp.asarray(every_sequence(3)[:50])
  state = jax.jit(lambda p: model.apply({'params': p}, x, mutable=[names.COLLECTION])[1])(params)
  sown = [np.asarray(v) for n, v in names.flat(state[names.COLLECTION]).items()
          if n.endswith(('.attn.pattern', '.v_mixture', '.ffn.mixture'))]
  assert len(sown) == 3 * hard.num_layers  # value and FFN mixtures, attention weights, per layer
  first = hard.num_heads - hard.program.numerical_heads
  for s in sown:
    if s.shape[-1] == s.shape[-2] == x.shape[1] and hard.program.numerical_heads:  # attention [b, heads, q, k]
      s, numerical = s[:, :first], s[:, first:]
      assert set(np.unique(numerical)) <= {0.0, 1.0}  # a numerical head selects keys: S_ij is 0 or 1
      n = numerical.sum(-1)
      assert (n == 0).any() and (n == 1).any() and (n > 1).any()  # random parameters: none, one, several
    np.testing.assert_array_equal(np.sort(s, -1)[..., -1], 1.0)
    np.testing.assert_array_equal(s.sum(-1), 1.0)
  # Whether gradients flow depends on the kinds of heads and on the position rows, not on the mask.
  gradient_settings = [SETTINGS[n] for n in ('causal', 'bidirectional-qk_positions-numerical',
                                             'bidirectional-qk_positions-numerical_without')]
  setting_of = (hard.causal, hard.attention.qk_positions, hard.program.numerical_heads,
                hard.program.numerical_positions)
  if setting_of not in gradient_settings:
    return
  grads = jax.jit(jax.grad(lambda p: model.apply({'params': p}, x).astype(jnp.float32).sum()))(params)
  for layer in ('layer_0', 'layer_1'):  # straight-through: the softmaxes' parameters still learn
    leaves = [grads[layer]['attention']['query']['kernel'], grads[layer]['value_projection']['log_tau'],
              grads[layer]['ffn']['projection']['log_tau']]
    if hard.program.numerical_heads:
      leaves.append(grads[layer]['count_projection']['count_logits'])
    if hard.program.numerical_heads:  # the count's gradient reaches the numerical heads' predicate
      leaves.append(grads[layer]['attention']['query']['kernel'][:, first:])
    for leaf in leaves:
      assert np.abs(np.asarray(leaf)).max() > 0


# With a full mask a permuted sequence gives a numerical head the same multiset of keys.
@pytest.mark.parametrize('setting', [SETTINGS[n] for n in ('bidirectional-qk_positions-numerical',
                                                            'bidirectional-qk_positions-numerical_without')],
                         ids=['with', 'without'], indirect=True)
def test_numerical_heads_without_positions_select_by_tokens_alone(setting):
  program, _, _, params, hard = setting
  x = jnp.asarray(every_sequence(5)[::37])
  order = np.asarray([3, 0, 4, 1, 2])

  @jax.jit
  def numerical_weights(tokens):  # layer 0's numerical heads: [batch, heads, q, k]
    _, state = model_lib.build(hard).apply({'params': params}, tokens, mutable=[names.COLLECTION])
    return names.flat(state[names.COLLECTION])['blocks.0.attn.pattern'][:, -hard.program.numerical_heads:]

  moved = np.asarray(numerical_weights(x))[:, :, order][..., order]
  permuted = np.asarray(numerical_weights(x[:, order]))
  if hard.program.numerical_positions:  # ALiBi and the position rows: where a key is changes what is selected
    assert (moved != permuted).any()
  else:
    np.testing.assert_array_equal(moved, permuted)
  with open(program.__file__) as f:  # and the program says which kind of predicate it is
    assert ('(numerical, no positions)' in f.read()) == (not hard.program.numerical_positions)


def test_a_written_program_runs_with_numpy_alone(setting, tmp_path):
  program, hard, _, _, _ = setting
  folder = os.path.dirname(program.__file__)
  tags = predict_with_numpy_alone(program.__file__, ['<s>', 'a', 'b', 'a'], str(tmp_path))
  expected = np.asarray(hard(np.asarray([[1, 2, 3, 2]], np.int32), np.ones((1, 4), bool)))[0]
  assert tags == [TOKENS[i] for i in expected]
  assert sorted(os.listdir(folder)) == ['program.npz', 'program.py']


@pytest.fixture(scope='module')
def sort_run():
  """The program-trained sort recipe's model with random parameters, loaded as ``symjax.load`` gives a run."""
  from symjax import tasks
  from symjax.configs import rasp
  from symjax.run import workdir
  from symjax.train import config as config_lib
  config = rasp.get_config('task=sort,runlocal=true,program=true')
  task = tasks.get_task(config)
  model_config = config_lib.model_config(config, len(task.vocab), task.causal)
  model = model_lib.build(model_config)
  params = randomize(shapes_of(model, jnp.zeros((1, 4), jnp.int32))['params'], 3)
  return workdir.Loaded(model, params, config, model_config, task, step=0, task='sort', seq_len=8,
                        language_model=False), task


def test_a_program_is_scored_on_each_sequence_of_the_split_once_in_one_call(sort_run, tmp_path):
  loaded, task = sort_run
  program = decompile.decompile(loaded, 'sort.npz')
  path, data = decompile.write(program, str(tmp_path / 'sort.py'))
  measured = decompile.evaluate(loaded, decompile.load_program(path), 'test')
  # The last evaluation batch of 500 is filled up with empty rows; they are not sequences.
  assert measured['sequences'] == task.split_size('test') == 1953
  assert measured['fidelity'] == 100.0  # a hard model, padded sequences of unequal length, one batch
  # By length (tagged positions per sequence): every length of the split, each weighed by its positions.
  by_length, positions = measured['program_accuracy_by_length'], measured['positions_by_length']
  batch = np.concatenate([b['weights'] for b in task.eval_batches('test', 500, loaded.config.data_seed)]) > 0
  lengths = batch.sum(1)[batch.any(1)]
  assert positions == {str(n): int(n * (lengths == n).sum()) for n in np.unique(lengths)}
  assert len(positions) > 1 and sum(positions.values()) == measured['positions']
  assert sum(by_length[n] * positions[n] for n in positions) / measured['positions'] == pytest.approx(
      measured['program_accuracy'])
  with open(path) as f:
    assert program.lines == len(f.read().splitlines())
  umask = os.umask(0)
  os.umask(umask)
  for written in (path, data):  # the mode any new file gets, as the JSON beside them
    assert os.stat(written).st_mode & 0o777 == 0o666 & ~umask, written
  assert decompile.not_exact(loaded.model_config) is None
  assert decompile.not_exact(loaded.model_config.replace(hard=False, gumbel_scale=0.0)).startswith(
      'warning: this model was not program-trained (model.hard = False)')


def test_the_ffn_tables_gelu_is_the_tanh_approximation():
  x = np.random.default_rng(0).normal(0.0, 3.0, (64, 32))
  expected = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
  np.testing.assert_allclose(decompile._gelu(x), expected, rtol=1e-13, atol=1e-15)


def test_multiset_ranks_number_every_multiset_once():
  for vocab, k in ((5, 3), (9, 2), (12, 4), (3, 1)):
    sets = decompile.all_multisets(vocab, k)
    assert len(sets) == decompile.multiset_count(vocab, k) == len({tuple(r) for r in sets})
    np.testing.assert_array_equal(decompile.multiset_rank(sets), np.arange(len(sets)))
    np.testing.assert_array_equal(decompile.multiset_rank(sets[:, ::-1]), np.arange(len(sets)))  # order-free


def test_unsupported_models_and_tasks_are_named():
  with pytest.raises(InputError, match=r"model.kind = 'token_factored' \(supported: 'symbolic'\)"):
    decompile.check_supported(CONFIG.replace(kind='token_factored'), 'sort')
  with pytest.raises(InputError, match=r"model.vocab_ffn = 'dense'"):
    decompile.check_supported(CONFIG.replace(vocab_ffn='dense'), 'sort')
  with pytest.raises(InputError, match=r"tagging tasks \['reverse', .*'induction'\]; this run trained 'text'"):
    decompile.check_supported(CONFIG, 'text')
  with pytest.raises(InputError, match=r"model.hard .* model.vocab_projection = 'streamed' \(needs 'direct'\)"):
    CONFIG.replace(hard=True, vocab_projection='streamed').validate()
  with pytest.raises(InputError, match=r'model.numerical_positions = False .* needs model.numerical_heads >= 1, got 0'):
    CONFIG.replace(numerical_positions=False).validate()
  with pytest.raises(InputError, match=r'model.numerical_heads must be in \[0, model.num_heads = 3\], got 4'):
    CONFIG.replace(numerical_heads=4).validate()
  with pytest.raises(InputError, match=r"numerical_heads needs .*model.attention_impl = 'xla' \(needs 'explicit'\)"):
    CONFIG.replace(numerical_heads=1, attention_impl='xla').validate()


def test_program_files_are_never_written_over_unless_named(tmp_path):
  path = str(tmp_path / 'program.py')
  decompile.check_output(path, named=False)  # nothing there yet
  (tmp_path / 'program.npz').write_bytes(b'a file of the user')
  for named in (False, True):
    with pytest.raises(InputError, match='program.npz'):
      decompile.check_output(path, named=named)
  (tmp_path / 'program.py').write_text('# a program')
  with pytest.raises(InputError, match=r'already exists and was not named; pass --output='):
    decompile.check_output(path, named=False)
  decompile.check_output(path, named=True)  # the user named it: the pair is replaced
  with pytest.raises(InputError, match=r'must name a \.py file'):
    decompile.check_output(str(tmp_path / 'program.txt'), named=True)


@pytest.mark.slow
def test_the_command_on_a_program_trained_run_and_on_a_token_factored_one(tmp_path):
  """End to end: a few steps of program training on sort, then the command; the program equals its model
  on the whole test split. A token_factored run gets a one-line error and nothing is written."""
  hard = str(tmp_path / 'hard')
  train = [sys.executable, '-m', 'symjax.main', '--config.progress_bar=false', '--config.total_steps=30',
           '--config.eval_every_steps=30']
  proc = subprocess.run([*train[:3], '--config=rasp:task=sort,model=symbolic,runlocal=true', *train[3:],
                         '--config.model.hard=true', f'--workdir={hard}'], cwd=REPO, capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-2000:]
  output = str(tmp_path / 'out' / 'sort.py')
  proc = subprocess.run([sys.executable, '-m', 'symjax.decompile', f'--workdir={hard}', f'--output={output}'],
                        cwd=REPO, capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert 'fidelity 100.00%' in proc.stdout, proc.stdout
  assert 'of 1,953 sequences' in proc.stdout, proc.stdout  # the split's, not its padding rows
  assert 'inputs of uniformly drawn length, ' in proc.stdout and 'of 2,000 sequences' in proc.stdout, proc.stdout
  assert not proc.stderr.strip()  # a program-trained model: no warning
  assert os.path.isfile(output) and os.path.isfile(output[:-3] + '.npz')
  # Sort's whole input space is its three splits (5 + 5² + ... + 5⁶ = 19,530 sequences): the program equals
  # the model on every one of them.
  import symjax
  loaded, program = symjax.load(hard), decompile.load_program(output)
  measured = [decompile.evaluate(loaded, program, split) for split in ('train', 'validation', 'test')]
  assert sum(m['sequences'] for m in measured) == 19_530
  assert [m['fidelity'] for m in measured] == [100.0, 100.0, 100.0]

  soft = str(tmp_path / 'soft')  # the paper's continuous model: the command says its fidelity is measured
  proc = subprocess.run([*train[:3], '--config=rasp:task=sort,model=symbolic,runlocal=true', *train[3:],
                         f'--workdir={soft}'], cwd=REPO, capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-2000:]
  proc = subprocess.run([sys.executable, '-m', 'symjax.decompile', f'--workdir={soft}'], cwd=REPO,
                        capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines() == [decompile.not_exact(CONFIG.replace(hard=False))]

  factored = str(tmp_path / 'factored')
  proc = subprocess.run([*train[:3], '--config=rasp:task=sort,model=token_factored,runlocal=true', *train[3:],
                         f'--workdir={factored}'], cwd=REPO, capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-2000:]
  proc = subprocess.run([sys.executable, '-m', 'symjax.decompile', f'--workdir={factored}'], cwd=REPO,
                        capture_output=True, text=True)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines()[-1] == (
      "error: decompilation reads the paper's Symbolic Transformer only: model.kind = 'token_factored' "
      "(supported: 'symbolic')")
  assert not os.path.exists(os.path.join(factored, 'program'))
