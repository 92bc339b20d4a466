"""How near a Symbolic Transformer's program comes to a Transformer Program: the predicates found are the written
programs' own ``select_closest`` and ``select``, found exactly where one exists and refused where none does."""

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import PROGRAM, PROGRAM_TOKENS, randomize, shapes_of

from symjax import model as model_lib
from symjax.proj import decompile, program_code, program_form

CARD = program_form.CARD


def runtime(n: int, allowed: np.ndarray) -> dict:
  """The written programs' ``select`` and ``select_closest``, as a program carries them."""
  names = {'np': np, 'TOKENS': [], 'CARDINALITY': CARD, 'MAX_LEN': n, 'ALLOWED': allowed}
  for function in ('Variable', '_table', 'select', 'select_closest'):
    exec(program_code.RUNTIME[function].replace('{one_sided}', ''), names)  # noqa: S102 - the project's own text
  return names


def draw(seed: int, batch: int = 300, n: int = 6, values: int = 4, causal: bool = False):
  """Query and key variables, the real positions (each row's padding after its tokens) and the allowed keys."""
  rng = np.random.default_rng(seed)
  queries, keys = rng.integers(0, values, (2, batch, n))
  lengths = rng.integers(1, n + 1, batch)
  real = np.arange(n)[None] < lengths[:, None]
  allowed = real[:, None, :] & (np.tril(np.ones((n, n), bool)) if causal else np.ones((n, n), bool))
  return queries, keys, real, allowed


@pytest.mark.parametrize('causal', [False, True])
def test_closest_reads_the_key_the_written_programs_select_closest_reads(causal):
  queries, keys, real, allowed = draw(0, causal=causal)
  predicate = np.random.default_rng(1).random((CARD, CARD)) < 0.3
  names = runtime(queries.shape[1], allowed)
  variable = lambda ids: names['Variable'](ids, False)
  written = names['select_closest'](variable(keys), variable(queries), lambda q, k: bool(predicate[q, k]))
  read = program_form.closest(predicate, queries, keys, allowed)
  assert (read == written)[real].all()
  assert (read[real] != 0).any() and (read[real] == 0).any()  # some queries match a key, some none


@pytest.mark.parametrize('causal', [False, True])
@pytest.mark.parametrize('seed', [2, 3, 4])
def test_a_predicate_is_found_for_reads_one_made_and_refused_for_reads_none_makes(seed, causal):
  queries, keys, real, allowed = draw(seed, causal=causal)
  made = np.random.default_rng(seed).random((CARD, CARD)) < 0.4
  read = program_form.closest(made, queries, keys, allowed)
  found = program_form.closest_predicate(queries, keys, read, allowed, real)
  assert found is not None
  assert (program_form.closest(found, queries, keys, allowed) == read)[real].all()
  # Two queries alike in value and place, keys alike, that read different keys (neither position 0, which a
  # query also reads where it matches nothing): no predicate tells them apart.
  twin = np.flatnonzero(real.all(1))[:2]
  queries[twin[1]], keys[twin[1]] = queries[twin[0]], keys[twin[0]]
  read = program_form.closest(made, queries, keys, allowed)
  last = queries.shape[1] - 1  # every key is allowed there, causal or not
  read[twin[1], last] = 1 if read[twin[0], last] != 1 else 2
  assert program_form.closest_predicate(queries, keys, read, allowed, real) is None


def test_a_query_reading_position_0_matches_it_or_matches_nothing():
  n = 4
  real = np.ones((2, n), bool)
  allowed = np.broadcast_to(real[:, None, :], (2, n, n))
  queries = np.array([[0, 0, 0, 0], [0, 0, 0, 0]])
  keys = np.array([[1, 2, 2, 2], [2, 2, 2, 2]])  # row 1: position 0 holds what every other key holds
  read = np.zeros((2, n), np.int64)
  found = program_form.closest_predicate(queries, keys, read, allowed, real)
  assert found is not None and not found[0, 2] and found[0, 1]
  assert (program_form.closest(found, queries, keys, allowed) == 0).all()


def test_selections_one_predicate_makes_are_matched_exactly_and_others_refused():
  queries, keys, real, allowed = draw(5)
  made = np.random.default_rng(5).random((CARD, CARD)) < 0.5
  names = runtime(queries.shape[1], allowed)
  variable = lambda ids: names['Variable'](ids, False)
  selected = names['select'](variable(keys), variable(queries), lambda q, k: bool(made[q, k]))
  found = program_form.selecting_predicate(queries, keys, selected, allowed)
  assert found is not None
  assert (found[queries[:, :, None], keys[:, None, :]] & allowed == selected).all()
  b, i, j = (x[0] for x in np.nonzero(selected))
  selected[b, i, j] = False  # one selection unmade where the same pair of values is selected elsewhere
  assert program_form.selecting_predicate(queries, keys, selected, allowed) is None


def test_the_fewest_variables_that_determine_a_value_are_those_it_is_made_of():
  rng = np.random.default_rng(6)
  variables = {name: rng.integers(0, 5, (200, 6)) for name in 'abcd'}
  mask = rng.random((200, 6)) < 0.8
  out = variables['b'] * 5 + variables['d']
  assert program_form.fewest(out, variables, list('abcd'), mask) == ['b', 'd']
  assert not program_form.determines(out, [variables['b'], variables['c']], mask)
  assert program_form._pair_determines(out, variables, list('abcd'), mask) == ['b', 'd']
  assert program_form._pair_determines(out + variables['a'], variables, list('abcd'), mask) is None


def test_every_module_of_a_program_is_measured_and_what_it_needs_determines_it(tmp_path):
  config = PROGRAM.replace(qk_positions=True, numerical_heads=1, hard=True)
  params = randomize(shapes_of(model_lib.build(config), jnp.zeros((1, 4), jnp.int32))['params'], 4)
  rng = np.random.default_rng(7)
  inputs = rng.integers(1, config.vocab_size, (400, 5))
  lengths = rng.integers(1, 6, 400)
  real = np.arange(5)[None] < lengths[:, None]
  form = program_form.form_of(params, config, inputs, lengths, real)
  program = decompile.load_program(decompile.write(decompile.build(params, config, PROGRAM_TOKENS),
                                                   str(tmp_path / 'program.py'))[0])
  state = {'tok': inputs, 'real': real}
  for l in range(config.num_layers):  # every variable as the written program computes it
    getattr(program, f'block_{l}')(state)
  heads = [f'attn{l}.{h}' for l in range(config.num_layers) for h in range(config.num_heads)]
  ffns = [f'ffn{l}.{c}' for l in range(config.num_layers) for c in range(config.num_heads)]
  assert sorted(form) == sorted(heads + ffns + ['readout'])
  assert [form[h]['counting'] for h in heads[:config.num_heads]] == [False] * (config.num_heads - 1) + [True]
  for name in heads:
    assert 0.0 < form[name]['share'] <= 1.0 and form[name]['values'] == len(np.unique(state[name][real]))
  variables = {**state, 'positions': np.broadcast_to(np.arange(5), inputs.shape)}
  for name in ffns:
    assert set(form[name]['needs']) <= set(form[name]['reads'])
    assert program_form.determines(state[name], [variables[v] for v in form[name]['needs']], real)
  tags = program.predict_ids(inputs, lengths)
  assert program_form.determines(tags, [variables[v] for v in form['readout']['needs']], real)
  assert (form['readout']['needs'] == []) == (len(np.unique(tags[real])) == 1)  # nothing is needed for one tag
