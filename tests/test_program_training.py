"""Program training: the one-hot (hard) Symbolic Transformer whose program decompiles exactly, trained with
straight-through gradients, Gumbel samples and soft first steps; and the recipe records that choose it."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import PROGRAM as CONFIG
from helpers import every_sequence, randomize, shapes_of

from symjax import model as model_lib
from symjax.model import intermediates as names
from symjax.system.errors import InputError


@pytest.mark.slow
def test_soft_steps_train_the_soft_model_first_then_the_hard_one(tmp_path):
  """config.soft_steps = 10 of 20: at step 10 the parameters equal a soft run's; by step 20 they differ."""
  from helpers import tiny_config

  from symjax.train import trainer

  def run(name, **model):
    config = tiny_config(total_steps=20, eval_every_steps=10, task='induction')
    for k, v in model.items():
      config.model[k] = v
    if model.get('hard'):
      config.soft_steps = 10
    trainer.train_and_evaluate(config, str(tmp_path / name))
    return str(tmp_path / name)

  _equal_at_10_not_at_20(run('soft'), run('staged', hard=True))


def _equal_at_10_not_at_20(one: str, other: str) -> None:
  """Two runs' parameters: equal, leaf for leaf, at step 10; not all equal at step 20."""
  from helpers import params_of
  for which, equal in ((10, True), (20, False)):
    same = [np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params_of(one, which)),
                                                  jax.tree.leaves(params_of(other, which)))]
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


@pytest.mark.slow
def test_straight_steps_end_relaxed_training_on_the_argmax_program(tmp_path):
  """config.straight_steps = 10 of 20 on a relaxed Transformer Program: at step 10 the parameters equal a run
  relaxed throughout, by step 20 they differ."""
  from symjax import configs
  from symjax.train import trainer

  def run(name, straight):
    config = configs.from_file('rasp:task=sort,model=program,runlocal=true')
    config.total_steps, config.eval_every_steps, config.keep_checkpoints = 20, 10, 2
    config.progress_bar, config.straight_steps = False, straight
    assert config.model.relaxed
    trainer.train_and_evaluate(config, str(tmp_path / name))
    return str(tmp_path / name)

  _equal_at_10_not_at_20(run('relaxed', 0), run('ended', 10))


def test_straight_steps_need_relaxed_program_training_and_fit_in_the_run():
  from helpers import tiny_config

  from symjax.train import config as config_lib
  config = tiny_config(straight_steps=5)
  with pytest.raises(InputError, match=r"config.straight_steps = 5 ends relaxed program training straight-through: "
                                       r"it needs model.kind = 'program' and model.relaxed = True, got 'symbolic'"):
    config_lib.validate(config)
  from symjax import configs
  config = configs.from_file('rasp:task=sort,model=program,runlocal=true')
  config.straight_steps = config.total_steps
  with pytest.raises(InputError, match=r'config.straight_steps must be in \[0, config.total_steps = \d+\)'):
    config_lib.validate(config)
  config.straight_steps, config.model.relaxed = 1, False
  with pytest.raises(InputError, match=r"got 'program' and False"):
    config_lib.validate(config)
  # Dyck-2's recipe ends with 9,000 of 36,000 steps straight-through; runlocal keeps that share of its 20.
  recipe, local = (configs.from_file(f'rasp:task=dyck2,model=program{extra}') for extra in ('', ',runlocal=true'))
  assert (recipe.straight_steps, recipe.total_steps, local.straight_steps, local.total_steps) == (9000, 36000, 5, 20)
  config_lib.validate(local)


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
  config = CONFIG.replace(hard=True, numerical_heads=1)
  params = randomize(shapes_of(model_lib.build(config), jnp.zeros((1, 4), jnp.int32))['params'], 1)
  noisy = model_lib.build(config.replace(gumbel_scale=1.0))
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
    CONFIG.replace(gumbel_scale=1.0).validate()
  with pytest.raises(InputError, match=r'model.gumbel_scale must be a finite number >= 0 \(0 = off\), got -1.0'):
    config.replace(gumbel_scale=-1.0).validate()


@pytest.mark.slow  # two training runs
def test_gumbel_noise_anneals_geometrically_and_changes_what_program_training_learns(tmp_path):
  """The scale goes from model.gumbel_scale to model.gumbel_scale_end geometrically over the run (constant
  without an end); a program-training run with it learns other parameters than one without."""
  from helpers import params_of, tiny_config

  from symjax.train import trainer
  config = CONFIG.replace(hard=True, gumbel_scale=3.0, gumbel_scale_end=0.01)
  schedule = trainer.gumbel_schedule(config, 101)
  np.testing.assert_allclose([schedule(0), schedule(50), schedule(100)], [3.0, np.sqrt(0.03), 0.01], rtol=1e-5)
  constant = trainer.gumbel_schedule(config.replace(gumbel_scale_end=None), 101)
  np.testing.assert_allclose([constant(0), constant(100)], [3.0, 3.0])
  with pytest.raises(InputError, match=r'model.gumbel_scale_end must be a finite number > 0 with '
                                       r'model.gumbel_scale > 0 \(or None: constant\), got 0.0'):
    config.replace(gumbel_scale_end=0.0).validate()

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


def test_accuracy_at_another_draws_lengths_weighs_each_length_by_its_positions_there():
  from benchmarks.lib.collect import at_lengths
  uniform = {'1': 100.0, '2': 80.0, '7': 70.0}  # the short inputs right more often
  # A draw of mostly long inputs (50 positions of length 7 for 10 of length 2): 70 · 5/6 + 80 · 1/6.
  assert at_lengths(uniform, {'2': 10, '7': 50}) == pytest.approx(215 / 3)
  assert at_lengths(uniform, {'1': 1, '2': 2, '7': 7}) == pytest.approx((100 + 160 + 490) / 10)
  assert at_lengths(uniform, {'3': 5, '7': 5}) is None  # a length the first draw has no accuracy at
  assert at_lengths(uniform, {}) is None


def test_runs_read_as_restarts_keep_each_seeds_best_initialisation_on_validation():
  from benchmarks.lib.collect import restarted
  best = {0: 70.0, 1: 72.0, 2: 71.0, 3: 68.0, 4: 68.0, 5: 67.0, 6: 75.0}  # 6: a seed with 1 of its 3
  kept = restarted([{'seed': s, 'best_validation_accuracy': v} for s, v in best.items()], 3)
  assert [(s['seed'], s['kept']) for s in kept['restarted_seeds']] == [(0, 1), (1, 3)]  # 3 before 4 on a tie
  assert kept['best_values'] == [72.0, 68.0] and kept['best_of_restarts']['mean'] == 70.0
  assert kept['first_initialisation']['values'] == [70.0, 68.0]
  assert restarted([{'seed': 6, 'best_validation_accuracy': 75.0}], 3) is None


def test_restarted_seeds_train_disjoint_initialisations_and_one_seed_is_itself():
  from benchmarks.lib.collect import initialisations
  assert [initialisations(s, 5) for s in range(3)] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11, 12, 13, 14]]
  assert initialisations(2, 1) == [2]
  with pytest.raises(ValueError, match='restarts must be >= 1'):
    initialisations(0, 0)


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
  record = run_record(str(run), ['num_heads', 'numerical_positions', 'learning_rate', 'length_balance'])
  # a model field as run, one from before it existed at its default, a field of the config itself, and one of
  # the config from before it existed at its default
  assert record['setting'] == {'num_heads': 8, 'numerical_positions': True, 'learning_rate': 1e-3,
                               'length_balance': 0.0}
  assert record['validation_accuracy_by_step'] == {'2': 50.0, '4': 75.0}
  assert record['best_validation_accuracy'] == 75.0  # the test row is never read
  assert 'program_lines' not in record
  (run / 'program').mkdir()
  (run / 'program' / 'measured.json').write_text(json.dumps({'lines': 158, 'program_accuracy': 100.0}))
  record = run_record(str(run), ['num_heads'])
  assert record['program_lines'] == 158 and 'program_accuracy' not in json.dumps(record)
  with pytest.raises(InputError, match=r"'warmup' is neither a config.model field nor a config field"):
    run_record(str(run), ['warmup'])
  (run / 'metrics.jsonl').unlink()
  with pytest.raises(InputError, match=r'not a finished training run: metrics.jsonl is missing'):
    run_record(str(run), ['num_heads'])
