"""Decompilation: a Symbolic Transformer as a program, exact where the model's mixtures and attention are
one-hot (program training, ``model.hard``), measurably unfaithful where they are spread."""

import dataclasses
import itertools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import REPO, randomize, shapes_of

from symjax import model as model_lib
from symjax.model import intermediates as names
from symjax.proj import decompile
from symjax.system.errors import InputError

TOKENS = ['<pad>', '<s>', 'a', 'b', 'c', 'd']
CONFIG = model_lib.ModelConfig(kind='symbolic', vocab_size=len(TOKENS), num_layers=2, num_heads=3, head_dim=4,
                               ff_dim_per_head=8, max_len=8, tie_embeddings=False)


def every_sequence(n):
  """Every sequence of n tokens (the padding token excluded) as ids ``[count, n]``."""
  return np.asarray(list(itertools.product(range(1, len(TOKENS)), repeat=n)), np.int32)


SETTINGS = {'causal': (True, False, 0, True), 'bidirectional': (False, False, 0, True),
            'bidirectional-qk_positions': (False, True, 0, True), 'causal-numerical': (True, False, 1, True),
            'bidirectional-qk_positions-numerical': (False, True, 2, True),
            'bidirectional-qk_positions-numerical_without': (False, True, 2, False)}


@pytest.fixture(scope='module', params=list(SETTINGS.values()), ids=list(SETTINGS))
def setting(request, tmp_path_factory):
  """Random parameters (every one away from its init), the program written from them, and the model in
  its hard (one-hot) and its soft (the paper's) form."""
  causal, positions, numerical, numerical_positions = request.param
  config = dataclasses.replace(CONFIG, causal=causal, qk_positions=positions, numerical_heads=numerical,
                               numerical_positions=numerical_positions)
  hard = dataclasses.replace(config, hard=True)
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
  first = hard.num_heads - hard.numerical_heads
  for s in sown:
    if s.shape[-1] == s.shape[-2] == x.shape[1] and hard.numerical_heads:  # attention [b, heads, q, k]
      s, numerical = s[:, :first], s[:, first:]
      assert set(np.unique(numerical)) <= {0.0, 1.0}  # a numerical head selects keys: S_ij is 0 or 1
      n = numerical.sum(-1)
      assert (n == 0).any() and (n == 1).any() and (n > 1).any()  # random parameters: none, one, several
    np.testing.assert_array_equal(np.sort(s, -1)[..., -1], 1.0)
    np.testing.assert_array_equal(s.sum(-1), 1.0)
  grads = jax.jit(jax.grad(lambda p: model.apply({'params': p}, x).astype(jnp.float32).sum()))(params)
  for layer in ('layer_0', 'layer_1'):  # straight-through: the softmaxes' parameters still learn
    leaves = [grads[layer]['attention']['query']['kernel'], grads[layer]['value_projection']['log_tau'],
              grads[layer]['ffn']['projection']['log_tau']]
    if hard.numerical_heads:
      leaves.append(grads[layer]['count_projection']['count_logits'])
    if hard.numerical_heads:  # the count's gradient reaches the numerical heads' predicate
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

  def numerical_weights(tokens):  # layer 0's numerical heads: [batch, heads, q, k]
    _, state = model_lib.build(hard).apply({'params': params}, tokens, mutable=[names.COLLECTION])
    return np.asarray(names.flat(state[names.COLLECTION])['blocks.0.attn.pattern'])[:, -hard.numerical_heads:]

  moved, permuted = numerical_weights(x)[:, :, order][..., order], numerical_weights(x[:, order])
  if hard.numerical_positions:  # ALiBi and the position rows: where a key is changes what is selected
    assert (moved != permuted).any()
  else:
    np.testing.assert_array_equal(moved, permuted)
  with open(program.__file__) as f:  # and the program says which kind of predicate it is
    assert ('(numerical, no positions)' in f.read()) == (not hard.numerical_positions)


def test_a_written_program_runs_with_numpy_alone(setting, tmp_path):
  program, hard, _, _, _ = setting
  folder = os.path.dirname(program.__file__)
  script = ('import sys, importlib.util\n'
            f'spec = importlib.util.spec_from_file_location("p", {program.__file__!r})\n'
            'm = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n'
            "print(' '.join(m.predict(['<s>', 'a', 'b', 'a'])))\n"
            "assert not [n for n in sys.modules if n.split('.')[0] in ('jax', 'symjax', 'flax')]\n")
  proc = subprocess.run([sys.executable, '-c', script], cwd=str(tmp_path), capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-2000:]
  expected = np.asarray(hard(np.asarray([[1, 2, 3, 2]], np.int32), np.ones((1, 4), bool)))[0]
  assert proc.stdout.split() == [TOKENS[i] for i in expected]
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
  with open(path) as f:
    assert program.lines == len(f.read().splitlines())
  umask = os.umask(0)
  os.umask(umask)
  for written in (path, data):  # the mode any new file gets, as the JSON beside them
    assert os.stat(written).st_mode & 0o777 == 0o666 & ~umask, written
  assert decompile.not_exact(loaded.model_config) is None
  assert decompile.not_exact(dataclasses.replace(loaded.model_config, hard=False)).startswith(
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
    decompile.check_supported(dataclasses.replace(CONFIG, kind='token_factored'), 'sort')
  with pytest.raises(InputError, match=r"model.vocab_ffn = 'dense'"):
    decompile.check_supported(dataclasses.replace(CONFIG, vocab_ffn='dense'), 'sort')
  with pytest.raises(InputError, match=r"tagging tasks \['reverse', .*'induction'\]; this run trained 'text'"):
    decompile.check_supported(CONFIG, 'text')
  with pytest.raises(InputError, match=r"model.hard .* model.vocab_projection = 'streamed' \(needs 'direct'\)"):
    dataclasses.replace(CONFIG, hard=True, vocab_projection='streamed').validate()
  with pytest.raises(InputError, match=r'model.numerical_positions = False .* needs model.numerical_heads >= 1, got 0'):
    dataclasses.replace(CONFIG, numerical_positions=False).validate()
  with pytest.raises(InputError, match=r'model.numerical_heads must be in \[0, model.num_heads = 3\], got 4'):
    dataclasses.replace(CONFIG, numerical_heads=4).validate()
  with pytest.raises(InputError, match=r"numerical_heads needs .*model.attention_impl = 'xla' \(needs 'explicit'\)"):
    dataclasses.replace(CONFIG, numerical_heads=1, attention_impl='xla').validate()


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
  assert not proc.stderr.strip()  # a program-trained model: no warning
  assert os.path.isfile(output) and os.path.isfile(output[:-3] + '.npz')

  soft = str(tmp_path / 'soft')  # the paper's continuous model: the command says its fidelity is measured
  proc = subprocess.run([*train[:3], '--config=rasp:task=sort,model=symbolic,runlocal=true', *train[3:],
                         f'--workdir={soft}'], cwd=REPO, capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-2000:]
  proc = subprocess.run([sys.executable, '-m', 'symjax.decompile', f'--workdir={soft}'], cwd=REPO,
                        capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines() == [decompile.not_exact(dataclasses.replace(CONFIG, hard=False))]

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


@pytest.mark.slow
def test_soft_steps_train_the_soft_model_first_then_the_hard_one(tmp_path):
  """config.soft_steps = 10 of 20: at step 10 the parameters equal a soft run's; by step 20 they differ."""
  from helpers import params_of, tiny_config

  from symjax.train import trainer

  def run(name, **model):
    config = tiny_config(total_steps=20, eval_every_steps=10, task='induction')
    for k, v in model.items():
      config.model[k] = v
    if model.get('hard'):
      config.soft_steps = 10
    trainer.train_and_evaluate(config, str(tmp_path / name))
    return str(tmp_path / name)

  soft, staged = run('soft'), run('staged', hard=True)
  for which, equal in ((10, True), (20, False)):
    same = [np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params_of(soft, which)),
                                                  jax.tree.leaves(params_of(staged, which)))]
    assert all(same) if equal else not all(same), which


def test_soft_steps_need_program_training_and_fit_in_the_run():
  from helpers import tiny_config

  from symjax.train import config as config_lib
  config = tiny_config(soft_steps=5)
  with pytest.raises(InputError, match=r'config.soft_steps = 5 is for program training: set config.model.hard'):
    config_lib.validate(config)
  config.model.hard = True
  config.soft_steps = config.total_steps
  with pytest.raises(InputError, match=r'config.soft_steps must be in \[0, config.total_steps = 40\)'):
    config_lib.validate(config)


def test_gumbel_noise_samples_the_weights_and_keeps_zeros_and_gradients_finite():
  """The argmax of gumbel_perturbed at scale 1 is a sample from the weights (Gumbel-max); a zero weight is
  never drawn and passes no NaN back, nor does a row with no weight at all (a padding query)."""
  from symjax.model import program
  weights = jnp.asarray([0.5, 0.3, 0.2, 0.0])
  keys = jax.random.split(jax.random.key(0), 20_000)
  drawn = jax.vmap(lambda k: program.gumbel_perturbed(weights, k, 1.0).argmax())(keys)
  counts = np.bincount(np.asarray(drawn), minlength=4) / len(keys)
  np.testing.assert_allclose(counts, [0.5, 0.3, 0.2, 0.0], atol=0.015)  # ~4 standard errors
  sharp = jax.vmap(lambda k: program.gumbel_perturbed(weights, k, 0.05).argmax())(keys[:2000])
  assert (np.asarray(sharp) == 0).mean() > 0.99  # a small scale takes the mode
  rows = jnp.asarray([[0.7, 0.3, 0.0], [0.0, 0.0, 0.0]])
  grad = jax.grad(lambda w: (program.straight_through(program.gumbel_perturbed(w, keys[0], 1.0))
                             * jnp.arange(3.0)).sum())(rows)
  assert np.isfinite(np.asarray(grad)).all() and np.abs(np.asarray(grad[0, :2])).max() > 0
  # A numerical head's predicate under logistic noise of scale s selects a key with probability sigmoid(score/s).
  scores, allowed = jnp.asarray([[-1.0, 0.0, 2.0]]), jnp.ones((1, 3), bool)
  picked = jax.vmap(lambda k: program.predicate_weights(scores, allowed, True, k, 1.0))(keys)
  np.testing.assert_allclose(np.asarray(picked).mean(0)[0], jax.nn.sigmoid(scores[0]), atol=0.015)


def test_gumbel_noise_samples_while_training_only():
  """With model.gumbel_scale, the hard model given the noise stream samples its keys, tokens and counts
  (different streams, different one-hot outputs); without the stream (evaluation, the program) it is the
  noiseless hard model exactly. It is for program training only."""
  from symjax.model.program import GUMBEL_RNG
  config = dataclasses.replace(CONFIG, hard=True, numerical_heads=1)
  params = randomize(shapes_of(model_lib.build(config), jnp.zeros((1, 4), jnp.int32))['params'], 1)
  noisy = model_lib.build(dataclasses.replace(config, gumbel_scale=1.0))
  x = jnp.asarray(every_sequence(4)[:64])
  sampled = jax.jit(lambda key: noisy.apply({'params': params}, x, rngs={GUMBEL_RNG: key},
                                            mutable=[names.COLLECTION]))
  run = lambda model: np.asarray(jax.jit(lambda p: model.apply({'params': p}, x))(params))
  np.testing.assert_array_equal(run(noisy), run(model_lib.build(config)))
  a, b = (np.asarray(sampled(jax.random.key(i))[0]) for i in (1, 2))
  assert not np.array_equal(a, b) and not np.array_equal(a, run(noisy))
  _, state = sampled(jax.random.key(1))
  mixtures = [np.asarray(v) for n, v in names.flat(state[names.COLLECTION]).items()
              if n.endswith(('.v_mixture', '.ffn.mixture'))]
  for m in mixtures:  # a sample is still one token
    np.testing.assert_array_equal(m.max(-1), 1.0)
  with pytest.raises(InputError, match=r'model.gumbel_scale .* needs model.hard = True, got model.hard = False'):
    dataclasses.replace(CONFIG, gumbel_scale=1.0).validate()
  with pytest.raises(InputError, match=r'model.gumbel_scale must be a finite number >= 0 \(0 = off\), got -1.0'):
    dataclasses.replace(config, gumbel_scale=-1.0).validate()


def test_gumbel_noise_anneals_geometrically_and_changes_what_program_training_learns(tmp_path):
  """The scale goes from model.gumbel_scale to model.gumbel_scale_end geometrically over the run (constant
  without an end); a program-training run with it learns other parameters than one without."""
  from helpers import params_of, tiny_config

  from symjax.train import trainer
  config = dataclasses.replace(CONFIG, hard=True, gumbel_scale=3.0, gumbel_scale_end=0.01)
  schedule = trainer.gumbel_schedule(config, 101)
  np.testing.assert_allclose([schedule(0), schedule(50), schedule(100)], [3.0, np.sqrt(0.03), 0.01], rtol=1e-5)
  constant = trainer.gumbel_schedule(dataclasses.replace(config, gumbel_scale_end=None), 101)
  np.testing.assert_allclose([constant(0), constant(100)], [3.0, 3.0])
  with pytest.raises(InputError, match=r'model.gumbel_scale_end must be a finite number > 0 with '
                                       r'model.gumbel_scale > 0 \(or None: constant\), got 0.0'):
    dataclasses.replace(config, gumbel_scale_end=0.0).validate()

  def run(name, **model):
    config = tiny_config(total_steps=10, eval_every_steps=10, task='induction')
    for k, v in dict(hard=True, **model).items():
      config.model[k] = v
    trainer.train_and_evaluate(config, str(tmp_path / name))
    return jax.tree.leaves(params_of(str(tmp_path / name), 10))

  plain, sampled = run('plain'), run('sampled', gumbel_scale=3.0, gumbel_scale_end=0.01)
  assert all(np.isfinite(x).all() for x in sampled)
  assert not all(np.array_equal(a, b) for a, b in zip(plain, sampled))


def test_the_program_chosen_on_validation_is_the_best_seed_there_the_first_on_a_tie():
  from benchmarks.lib.collect import chosen_on_validation
  runs = {'0': {'validation_accuracy': 99.5, 'program_accuracy': 99.9},
          '1': {'validation_accuracy': 99.8, 'program_accuracy': 99.1},
          '2': {'validation_accuracy': 99.8, 'program_accuracy': 99.7}}
  assert chosen_on_validation(runs) == ('1', runs['1'])  # by validation, not by the test figure
  assert chosen_on_validation({'10': runs['1'], '9': runs['2']}) == ('9', runs['2'])  # seeds compare as numbers
  assert chosen_on_validation({'0': {'program_accuracy': 99.0}}) is None  # a file without validation


def test_a_recipe_trial_is_recorded_from_validation_alone_with_the_settings_it_names(tmp_path):
  import json

  from benchmarks.lib.collect import run_record
  run = tmp_path / 'hist_seed1'
  run.mkdir()
  (run / 'config.json').write_text(json.dumps({'task': 'hist', 'seed': 1, 'total_steps': 4, 'learning_rate': 1e-3,
                                               'model': {'num_heads': 8}}))
  rows = [{'step': 2, 'split': 'validation', 'accuracy': 0.5}, {'step': 2, 'split': 'test', 'accuracy': 1.0},
          {'step': 4, 'split': 'validation', 'accuracy': 0.75}]
  (run / 'metrics.jsonl').write_text('\n'.join(json.dumps(r) for r in rows))
  record = run_record(str(run), ['num_heads', 'numerical_positions', 'learning_rate'])
  # a model field as run, one from before it existed at its default, and a field of the config itself
  assert record['setting'] == {'num_heads': 8, 'numerical_positions': True, 'learning_rate': 1e-3}
  assert record['validation_accuracy_by_step'] == {'2': 50.0, '4': 75.0}
  assert record['best_validation_accuracy'] == 75.0  # the test row is never read
  with pytest.raises(InputError, match=r"'warmup' is neither a config.model field nor a config field"):
    run_record(str(run), ['warmup'])
  (run / 'metrics.jsonl').unlink()
  with pytest.raises(InputError, match=r'not a finished training run: metrics.jsonl is missing'):
    run_record(str(run), ['num_heads'])
