"""The model object: TransformerLens's calls on texts, id sequences and padded batches, each the same as the
functional call it wraps."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from helpers import OPT_LEVEL_0, REPO, compilations, randomize, shapes_of, small

from symjax import interpret
from symjax.interpret import HookedModel, circuits, hooks
from symjax.model import Transformer
from symjax.run.workdir import TokenVocab
from symjax.system.errors import InputError
from symjax.tasks import Vocab

WORDS = ['<s>', 'a', 'b', 'c', 'd', '0', '1', '2', '3', 'x', 'y', 'z', 'q']


@pytest.fixture(scope='module')
def hm():
  cfg = small(kind='symbolic')
  model = Transformer(cfg)
  params = randomize(shapes_of(model, np.zeros((1, 4), np.int32))['params'], 1)
  return HookedModel(model, params, TokenVocab(Vocab(WORDS)))


def test_texts_of_unequal_length_are_padded_with_their_key_mask(hm):
  ids = hm.to_tokens(['<s> a 1 b', '<s> c'])
  assert ids.shape == (2, 4) and ids.key_mask.tolist() == [[True] * 4, [True, True, False, False]]
  assert hm.to_tokens('<s> a 1').key_mask is None and hm.to_tokens('<s> a 1').tolist() == [[0, 1, 6]]
  assert len(hm.to_tokens('<s> a 1')[0]) == 3 and hm.to_tokens('a 1', prepend_bos=True).tolist() == [[0, 1, 6]]
  # The ids carry their mask into every call: a padded row's logits are the row's alone.
  np.testing.assert_allclose(hm(ids)[1, :2], hm('<s> c')[0], atol=1e-6)
  assert hm.to_str_tokens('<s> a 1') == ['<s>', 'a', '1']
  assert hm.to_str_tokens(['<s> a 1 b', '<s> c']) == [['<s>', 'a', '1', 'b'], ['<s>', 'c']]
  assert hm.to_string([0, 1, 6]) == '<s> a 1' and hm.cfg.kind == 'symbolic'


def test_weights_tokens_and_losses_under_transformer_lens_names(hm):
  ids = hm.to_tokens('<s> a 1 b 2')
  logits, cache = hm.run_with_cache(ids)
  # The readout: the final norm's output times W_U is the logits; the embedding's rows are the input state.
  np.testing.assert_allclose(np.asarray(cache['final.norm'], np.float64) @ hm.W_U, logits, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(hm.W_E[ids[0]], cache['embed'][0], rtol=1e-6, atol=1e-6)
  assert hm.W_U.shape == (hm.cfg.d_model, hm.cfg.vocab_size) == hm.W_E.T.shape
  one = hm.to_single_token('1')
  assert one == ids[0, 2]
  np.testing.assert_array_equal(hm.tokens_to_residual_directions('1'), hm.W_U[:, one])
  assert hm.tokens_to_residual_directions(ids).shape == (1, 5, hm.cfg.d_model)
  both = hm(ids, return_type='both')
  np.testing.assert_array_equal(both[0], hm(ids))
  assert both[1] == hm(ids, return_type='loss') and np.isfinite(both[1])
  for call, message in [(lambda: hm.to_single_token('a 1'), r"'a 1' is 2 tokens, not one"),
                        (lambda: hm.tokens_to_residual_directions([hm.cfg.vocab_size]), r'tokens must be ids in')]:
    with pytest.raises(InputError, match=message):
      call()


def test_the_config_answers_transformer_lens_names(hm):
  c = hm.cfg
  assert (c.n_layers, c.n_heads, c.d_head, c.d_model, c.d_vocab, c.n_ctx) == (
      c.num_layers, c.num_heads, c.head_dim, c.num_heads * c.head_dim, c.vocab_size, c.max_len)
  # a symbolic channel FFN's hidden units are every channel's together (blocks.{l}.ffn.hidden's last axis)
  _, cache = hm.run_with_cache('<s> a 1')
  assert c.d_mlp == c.num_heads * c.symbolic.ff_dim_per_head == cache['blocks.0.ffn.hidden'].shape[-1] * c.num_heads
  assert small(kind='standard').d_mlp == small(kind='standard').ff_dim and c.act_fn == 'gelu_new'


def test_the_model_object_prints_its_kind_shape_and_size(hm):
  c, n = hm.cfg, sum(int(np.size(p)) for p in jax.tree.leaves(hm.params))
  assert repr(hm) == (f'HookedModel(symbolic: {c.num_layers} layers, {c.num_heads} heads × {c.head_dim}, '
                      f'vocabulary {c.vocab_size}, context {c.max_len}, {n:,} parameters)')
  assert n > 1000


def test_calls_equal_the_functional_api_and_a_padded_row_equals_the_row_alone(hm):
  ids = hm.tokenizer.encode('<s> a 1 b 2')
  logits, cache = hm.run_with_cache('<s> a 1 b 2')
  want, want_cache = hooks.run_with_cache(hm.model, hm.params, ids)
  np.testing.assert_array_equal(logits, want)
  np.testing.assert_array_equal(cache['blocks.1.x_e'], want_cache['blocks.1.x_e'])
  np.testing.assert_array_equal(hm(ids), want)
  batch = hm(['<s> a 1 b 2', '<s> c'])
  np.testing.assert_allclose(batch[1, :2], hm('<s> c')[0], rtol=1e-5, atol=1e-5)  # causal: padding after it
  zeroed = hm.run_with_hooks('<s> a 1 b 2', {'blocks.0.attn.z': hooks.zero_head(0)})
  # zero_head's pass is compiled at its first call; the two calls share it (float32 rounding allowed).
  np.testing.assert_allclose(zeroed, hooks.run_with_hooks(hm.model, hm.params, ids,
                                                          {'blocks.0.attn.z': hooks.zero_head(0)}),
                             rtol=1e-5, atol=1e-5)
  assert cache.to_str_tokens() == ['<s>', 'a', '1', 'b', '2']


def test_bad_inputs_are_one_line_errors(hm):
  for call, message in [(lambda: hm('<s> nope'), r"tokens not in the vocabulary: \['nope'\]"),
                        (lambda: hm(np.zeros((1, 2, 3), int)), r'token ids must be 1-D \(one prompt\) or 2-D'),
                        (lambda: HookedModel(object()), r'HookedModel takes a loaded run'),
                        (lambda: HookedModel(hm.model, hm.params)('<s> a'), r'has no tokenizer'),
                        (lambda: hm(['<s> a', '<s>'], key_mask=[[1, 1], [1, 0]]), r'carry their own key mask'),
                        (lambda: hm(np.zeros((1, 0), int)), r'at least one id per prompt, got shape \(1, 0\)'),
                        (lambda: hm.run_with_hooks('<s> a', {'blocks.0.attn.z': hooks.zero_head(9)}),
                         r'zero_head\(9\) at blocks.0.attn.z: head out of range, the model has heads 0..2'),
                        (lambda: hm.run_with_hooks('<s> a', [('blocks.0.attn.pattern', hooks.zero_head(3))]),
                         r'zero_head\(3\) at blocks.0.attn.pattern: head out of range'),
                        (lambda: hm.run_with_hooks('<s> a', [('embed',)]), r'a list of \(site, fn\) pairs'),
                        (lambda: hm.run_with_cache('<s> a', names=['embed'], names_filter=['embed']),
                         r'names= or names_filter=, not both'),
                        (lambda: HookedModel(hm.model, hm.params, tensors='jax'),
                         r"tensors must be one of \['numpy', 'torch'\], got 'jax'"),
                        (lambda: hm.run_with_cache('<s> a', return_type='logit'), r'return_type must be one of'),
                        (lambda: hm.to_tokens(['<s> a', '<s>'], padding_side='left'),
                         r"padding_side must be 'right' \(symjax pads at the end"),
                        (lambda: hm.loss_fn(np.zeros((1, 3, 13)), np.zeros((1, 4), int)),
                         r'logits \(1, 3, 13\) and tokens \(1, 4\) must share \[batch, time\]')]:
    with pytest.raises(InputError, match=message) as e:
      call()
    assert '\n' not in str(e.value)


def test_get_act_name_gives_transformer_lens_names_that_reach_symjaxs_sites(hm):
  # TransformerLens's documented examples of utils.get_act_name.
  assert [interpret.get_act_name(*a) for a in [('k', 6, 'a'), ('pre', 2), ('embed',), ('normalized', 27, 'ln2'),
                                               ('k6',), ('scale4ln1',), ('pre5',)]] == [
      'blocks.6.attn.hook_k', 'blocks.2.mlp.hook_pre', 'hook_embed', 'blocks.27.ln2.hook_normalized',
      'blocks.6.attn.hook_k', 'blocks.4.ln1.hook_scale', 'blocks.5.mlp.hook_pre']
  _, cache = hm.run_with_cache('<s> a 1 b')
  for short, layer, site in [('v', 1, 'blocks.1.attn.values'), ('attn', 0, 'blocks.0.attn.pattern'),
                             ('in', 1, 'blocks.0.resid'), ('resid_pre', 0, 'embed')]:
    np.testing.assert_array_equal(cache[interpret.get_act_name(short, layer)], cache[site])
  # The loss per token is the cross-entropy of each next token; its mean is the loss.
  ids = hm.to_tokens('<s> a 1 b 2')
  per_token = hm.loss_fn(hm(ids), ids, per_token=True)
  assert per_token.shape == (1, 4) and float(per_token.mean()) == pytest.approx(hm(ids, return_type='loss'), 1e-6)
  assert hm.run_with_hooks(ids, {}, return_type=None) is None


def test_a_transformer_lens_hook_function_reads_hook_name_and_layer_and_may_return_nothing(hm):
  ids = hm.tokenizer.encode('<s> a 1 b 2')
  seen = []

  def zero_in_block_0(value, hook):  # as TransformerLens users write them
    seen.append((hook.name, hook.layer(), str(hook)))
    if hook.layer() == 0:
      return value.at[:, :, 1].set(0.0)

  got = hm.run_with_hooks(ids, fwd_hooks=[('blocks.0.attn.hook_z', zero_in_block_0),
                                          ('blocks.1.attn.z', zero_in_block_0)])
  np.testing.assert_allclose(got, hm.run_with_hooks(ids, {'blocks.0.attn.z': hooks.zero_head(1)}), rtol=1e-5,
                             atol=1e-5)
  assert ('blocks.0.attn.z', 0, 'blocks.0.attn.z') in seen and ('blocks.1.attn.z', 1, 'blocks.1.attn.z') in seen

  def layer_of_embed(value, hook):
    hook.layer()

  with pytest.raises(InputError, match=r"'embed' is not a site of a block"):
    hm.run_with_hooks(ids, {'embed': layer_of_embed})


def test_hooks_added_to_the_model_object_run_in_every_call_until_reset_and_chain_in_order(hm):
  from symjax.interpret import patching
  ids = hm.tokenizer.encode('<s> a 1 b 2')
  zero = hooks.zero_head(1)
  plain, zeroed = hm(ids), hm.run_with_hooks(ids, {'blocks.0.attn.z': zero})
  assert np.abs(plain - zeroed).max() > 1e-4
  hm.add_hook('blocks.0.attn.hook_z', zero)
  try:
    np.testing.assert_array_equal(hm(ids), zeroed)
    np.testing.assert_array_equal(hm.run_with_cache(ids)[0], zeroed)
    with pytest.raises(InputError, match=r'get_act_patch_resid_pre runs the model without the hooks added'):
      patching.get_act_patch_resid_pre(hm, ids[None], ids[None], patching.logit_difference(1, 2))
  finally:
    hm.reset_hooks()
  np.testing.assert_array_equal(hm(ids), plain)
  with hm.hooks(fwd_hooks=[('blocks.0.attn.z', zero)]):
    np.testing.assert_array_equal(hm(ids), zeroed)
  np.testing.assert_array_equal(hm(ids), plain)
  # Two hooks at one site run in order, the second on the first's output: (v + 1) · 2, not v · 2 + 1.
  add = lambda v, name: v + 1.0
  double = lambda v, name: v * 2.0
  want = hm.run_with_hooks(ids, {'blocks.1.attn.z': lambda v, name: (v + 1.0) * 2.0})
  np.testing.assert_allclose(hm.run_with_hooks(ids, [('blocks.1.attn.z', add), ('blocks.1.attn.z', double)]), want,
                             rtol=1e-6, atol=1e-6)
  with hm.hooks(fwd_hooks=[('blocks.1.attn.z', add)]):
    np.testing.assert_allclose(hm.run_with_hooks(ids, [('blocks.1.attn.z', double)]), want, rtol=1e-6, atol=1e-6)
  # A predicate adds the hook at every site it accepts, under symjax's names or TransformerLens's.
  patterns = [f'blocks.{l}.attn.pattern' for l in range(hm.cfg.num_layers)]
  for predicate in (lambda name: name.endswith('attn.pattern'), lambda name: name.endswith('hook_pattern')):
    seen = []
    hm.add_hook(predicate, lambda v, hook: seen.append(hook.name))
    try:
      hm(ids)
    finally:
      hm.reset_hooks()
    assert sorted(seen) == patterns
    assert sorted(hm.run_with_cache(ids, names_filter=predicate)[1].arrays) == patterns
  with pytest.raises(InputError, match=r"unknown site name 'blocks.0.attn.zz'"):
    hm.add_hook('blocks.0.attn.zz', zero)
  assert not hm._hooks


def test_transformer_lens_forms_of_hooks_and_names_give_what_the_dict_and_names_give(hm):
  ids = hm.tokenizer.encode('<s> a 1 b 2')
  zero = hooks.zero_head(1)
  # Different cached sites are different compiled passes: equal to float32 rounding.
  close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  close(hm.run_with_hooks(ids, [('blocks.0.attn.z', zero)]),
                                hm.run_with_hooks(ids, {'blocks.0.attn.z': zero}))
  logits, cache = hm.run_with_cache(ids, names_filter='blocks.1.x_e', fwd_hooks=[('blocks.0.attn.z', zero)])
  want_logits, want = hm.run_with_cache(ids, ['blocks.1.x_e'], {'blocks.0.attn.z': zero})
  close(logits, want_logits)
  assert list(cache.arrays) == ['blocks.1.x_e']
  close(cache['blocks.1.x_e'], want['blocks.1.x_e'])
  _, cache = hm.run_with_cache(ids, names_filter=lambda n: n == 'blocks.1.x_e', incl_grad=True,
                               metric=lambda l: l[:, -1, 2].mean())
  _, grads = hooks.site_gradients(hm.model, hm.params, ids, lambda l: l[:, -1, 2].mean(), ['blocks.1.x_e'])
  np.testing.assert_allclose(cache['blocks.1.x_e_grad'], grads['blocks.1.x_e'], rtol=1e-6, atol=1e-7)
  assert np.abs(cache['blocks.1.x_e_grad']).max() > 0


def test_transformer_lens_site_names_reach_the_same_sites(hm):
  ids = hm.tokenizer.encode('<s> a 1 b 2')
  _, cache = hm.run_with_cache(ids)
  last = hm.cfg.num_layers - 1
  for theirs, ours in [(('pattern', 0), 'blocks.0.attn.pattern'), (('v', 1), 'blocks.1.attn.values'),
                       (('resid_pre', 0), 'embed'), (('resid_pre', 1), 'blocks.0.resid'),
                       (('resid_post', -1), f'blocks.{last}.resid'), (('mlp_out', 1), 'blocks.1.ffn.out'),
                       ('blocks.1.hook_resid_post', 'blocks.1.resid'), ('blocks.0.attn.hook_attn_scores',
                                                                     'blocks.0.attn.scores'),
                       ('blocks.1.mlp.hook_post', 'blocks.1.ffn.hidden'), ('ln_final.hook_normalized', 'final.norm'),
                       (('pattern', 1, 'attn'), 'blocks.1.attn.pattern')]:
    np.testing.assert_array_equal(cache[theirs], cache[ours])
  zero = hooks.zero_head(1)
  np.testing.assert_allclose(hm.run_with_hooks(ids, [('blocks.0.attn.hook_z', zero)]),
                             hm.run_with_hooks(ids, {'blocks.0.attn.z': zero}), rtol=1e-5, atol=1e-5)
  _, only = hm.run_with_cache(ids, names_filter=['blocks.1.attn.hook_pattern'])
  assert list(only.arrays) == ['blocks.1.attn.pattern']
  for key, message in [(('pattern', hm.cfg.num_layers), r'layer 2 is out of range: the model has blocks 0..1'),
                       (('hook_pattern', 0), r"'hook_pattern' is not a TransformerLens name symjax has"),
                       (('pattern', 0, 1), r'a TransformerLens key is \(name, layer\) or \(name, layer, '
                                            r'layer_type\)')]:
    with pytest.raises(InputError, match=message):
      cache[key]


def test_boxed_params_are_unboxed_once_and_edits_in_place_are_seen_by_the_next_call(hm):
  import flax.linen as nn
  boxed = nn.Partitioned  # a partitioned leaf, as Flax's logical partitioning makes at init
  params = jax.tree.map(lambda x: boxed(np.array(x), names=(None,) * np.ndim(x)), hm.params)
  other = HookedModel(hm.model, params, hm.tokenizer)
  np.testing.assert_array_equal(other('<s> a 1 b'), hm('<s> a 1 b'))
  # The unboxed tree is the object's own: an ablation written into it reaches the compiled pass.
  table = other.params['embed']['embedding']
  other.params['embed']['embedding'] = np.zeros_like(table)
  assert not np.allclose(other('<s> a 1 b'), hm('<s> a 1 b'))
  other.params['embed']['embedding'] = table
  np.testing.assert_array_equal(other('<s> a 1 b'), hm('<s> a 1 b'))


def test_a_custom_pattern_scores_one_on_an_attention_that_matches_it_and_less_elsewhere():
  t = 6
  previous = np.eye(t, k=-1)
  previous[0, 0] = 1.0  # the first query has no previous key: it attends to itself
  other = np.full((t, t), 1 / t)
  attention = np.stack([previous, other])[None, None]  # [layers 1, batch 1, heads 2, t, t]
  scores = circuits.detect_head(attention, previous)
  assert scores.shape == (1, 2) and scores[0, 0] == 1.0 and scores[0, 1] < 0.5
  named = circuits.detect_head(attention, 'previous_token_head', tokens=np.arange(t)[None])
  assert named[0, 0] == 1.0  # the named pattern leaves the first query out: it has no previous key
  with pytest.raises(InputError, match=r"unknown detection pattern 'nope'; patterns: \['previous_token_head'"):
    circuits.detect_head(attention, 'nope', tokens=np.arange(t)[None])
  with pytest.raises(InputError, match=r'a detection pattern must be \[query, key\] = \(6, 6\)'):
    circuits.detect_head(attention, np.ones((3, 3)))


@pytest.mark.slow
def test_the_detectors_find_the_previous_token_and_induction_heads_of_the_default_induction_model(tmp_path):
  """The default recipe (symbolic, induction), trained until validation accuracy reaches 1: the strongest
  previous-token head is in block 0 and the strongest induction head in block 1, the heads the circuit
  finder names."""
  import symjax
  from symjax import tasks
  # The main job, trained for hundreds of steps: at XLA's default optimisation level, where the steps run
  # twice as fast as at the level the suite compiles at (tests/conftest.py).
  env = dict(os.environ, XLA_FLAGS=os.environ.get('XLA_FLAGS', '').replace(OPT_LEVEL_0, ''))
  proc = subprocess.run([sys.executable, '-m', 'symjax.main', '--config=configs/symbolic.py',
                         '--config.stop_at_accuracy=1.0', '--config.progress_bar=false',
                         f'--workdir={tmp_path / "run"}'], env=env, cwd=REPO, capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-3000:]
  run = symjax.load(str(tmp_path / 'run'))
  batch = next(tasks.get_task(run.config).eval_batches('test', 64, run.config.data_seed))
  _, cache = HookedModel(run).run_with_cache(batch['inputs'], key_mask=batch['key_mask'])
  previous, induction = cache.detect_head('previous_token_head'), cache.detect_head('induction_head')
  assert np.unravel_index(previous.argmax(), previous.shape)[0] == 0, previous
  assert np.unravel_index(induction.argmax(), induction.shape)[0] == 1, induction
  circuit = circuits.find_induction_circuit(run.model, run.params, batch['inputs'], batch['key_mask'])
  assert circuit.previous_token_head == tuple(int(i) for i in np.unravel_index(previous.argmax(), previous.shape))


def test_generate_continues_a_padded_batch_stops_at_the_stop_token_and_applies_hooks(hm):
  from symjax.run import sample
  ids = hm.tokenizer.encode('<s> a 1 b')
  alone = sample.generate(hm.model, hm.params, ids, 6)  # the compiled sampler, one prompt at a time
  short = sample.generate(hm.model, hm.params, hm.tokenizer.encode('<s> c'), 6)
  out = hm.generate([ids, hm.tokenizer.encode('<s> c')], 6)
  np.testing.assert_array_equal(out[0], alone)
  np.testing.assert_array_equal(out[1], short)  # the padded row continues from its own end
  assert hm.generate('<s> a 1 b', 6) == hm.to_string(alone)
  stop = int(alone[len(ids) + 2])
  stopped = hm.generate(ids, 6, stop_token=stop)
  first = len(ids) + int(np.flatnonzero(alone[len(ids):] == stop)[0])
  np.testing.assert_array_equal(stopped, alone[:first + 1])  # up to and with the first stop token
  zero_all = {'blocks.1.attn.z': lambda v, name: v * 0.0, 'blocks.1.ffn.out': lambda v, name: v * 0.0}
  hooked = hm.generate(ids, 6, fwd_hooks=zero_all)
  want = [int(t) for t in ids]
  for _ in range(6):  # the same greedy loop by hand, through run_with_hooks
    want.append(int(hm.run_with_hooks(np.asarray(want), zero_all)[0, -1].argmax()))
  np.testing.assert_array_equal(hooked, want)
  np.testing.assert_array_equal(hm.generate(ids, 6, eos_token_id=stop), stopped)
  # TransformerLens's sampling arguments sample; a greedy call given one refuses rather than ignore it.
  for kw, want_kw in [(dict(temperature=3.0), dict(mode='temperature', temperature=3.0)),
                      (dict(do_sample=True), dict(mode='temperature')),
                      (dict(top_k=2, temperature=2.0), dict(mode='top_k', top_k=2, temperature=2.0))]:
    runs = [hm.generate(ids, 6, seed=s, **kw) for s in range(4)]
    for s, run in enumerate(runs):
      np.testing.assert_array_equal(run, hm.generate(ids, 6, seed=s, **want_kw))
  assert any(not np.array_equal(hm.generate(ids, 6, seed=s, temperature=3.0), alone) for s in range(4))
  with pytest.raises(InputError, match=r'temperature given to greedy decoding, which takes none'):
    hm.generate(ids, 2, mode='greedy', temperature=0.5)
  with pytest.raises(InputError, match=r'top_k given to greedy decoding'):
    hm.generate(ids, 2, do_sample=False, top_k=3)
  with pytest.raises(InputError, match=r'stop_token .* is 2 tokens; give one token'):
    hm.generate(ids, 2, stop_token='a b')
  with pytest.raises(InputError, match=r'exceeds model.max_len = 16'):
    hm.generate(ids, 13)


@pytest.mark.parametrize('kind,extra', [('standard', {'positions': 'learned'}), ('token_factored', {}),
                                         ('symbolic', {'window': 3})])
def test_generation_with_the_key_value_cache_equals_the_full_pass_per_token(kind, extra):
  """Prompts of unequal length, greedy and each sampling mode, a hook carrying a number, a stop token: the
  cached loop gives today's tokens, token for token, in one program per shapes and hook structure."""
  cfg = small(kind=kind, max_len=24, **extra)
  model = Transformer(cfg)
  params = randomize(shapes_of(model, np.zeros((1, 4), np.int32))['params'], 1)
  hm = HookedModel(model, params)
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, cfg.vocab_size, n).tolist() for n in (5, 2, 7)]
  for mode in (dict(), dict(mode='temperature', temperature=0.8), dict(mode='top_k', top_k=4),
               dict(mode='top_p', top_p=0.7)):
    for scale in (0.0, 0.5):
      fwd_hooks = [('blocks.0.attn.z', lambda z, hook, scale=scale: z * scale)]
      with compilations() as count:
        cached = hm.generate(prompts, 10, fwd_hooks=fwd_hooks, seed=3, **mode)
      assert count() <= 1  # the second scale reuses the first one's program
      full = hm.generate(prompts, 10, fwd_hooks=fwd_hooks, seed=3, use_past_kv_cache=False, **mode)
      for a, b in zip(cached, full):
        np.testing.assert_array_equal(a, b)
  stop = int(full[0][6])
  for a, b in zip(hm.generate(prompts, 10, stop_token=stop),
                  hm.generate(prompts, 10, stop_token=stop, use_past_kv_cache=False)):
    np.testing.assert_array_equal(a, b)


def test_test_prompt_gives_each_answer_tokens_rank_and_probability(hm, capsys):
  result = hm.test_prompt('<s> a 1 b', 'c 2', top_k=3)
  logits = hm('<s> a 1 b c 2')[0]
  for j, step in enumerate(result['answer']):
    at = 3 + j
    row = logits[at] - logits[at].max()
    prob = np.exp(row) / np.exp(row).sum()
    token = step['id']
    assert step['rank'] == int((logits[at] > logits[at, token]).sum())
    assert step['prob'] == pytest.approx(prob[token], rel=1e-5)
    assert step['top'][0][0] == hm.to_string([int(logits[at].argmax())]) and len(step['top']) == 3
  printed = capsys.readouterr().out
  assert "answer: ['c', '2']" in printed and 'rank' in printed


def test_the_attention_figure_shows_every_head_with_token_labels(hm):
  _, cache = hm.run_with_cache(['<s> a 1 b', '<s> c'])
  fig = cache.attention_figure(batch=1)
  assert len(fig.axes) == hm.cfg.num_layers * hm.cfg.num_heads
  assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ['<s>', 'c']  # the padding left out
  assert fig.axes[hm.cfg.num_heads].get_title() == 'L1.H0'
  assert len(cache.attention_figure(layer=0).axes) == hm.cfg.num_heads
  with pytest.raises(InputError, match=r'layer 5 is out of range'):
    cache.attention_figure(layer=5)


def test_a_circuit_says_why_a_higher_scoring_previous_token_head_is_not_named():
  scores = np.array([[0.5, 0.1], [0.9, 0.2]])
  circuit = circuits.Circuit((0, 0), (1, 1), [(0, 0)], [(1, 1)], scores, np.array([[0.0, 0.0], [0.1, 0.8]]))
  assert 'L1.H0 scores higher (0.90) but is not in a block before the induction head' in circuit.describe()
  named = circuits.Circuit((1, 0), (1, 1), [(1, 0)], [(1, 1)], scores, scores)
  assert 'scores higher' not in named.describe()


def test_every_function_of_model_and_params_takes_the_model_object(hm):
  from symjax.interpret import attribution, core, tracing
  ids = np.asarray(hm.tokenizer.encode('<s> a 1 b 2 a'))
  np.testing.assert_array_equal(core.run(hm, ids)[0], core.run(hm.model, hm.params, ids)[0])
  np.testing.assert_array_equal(hooks.run_with_cache(hm, ids)[0], hooks.run_with_cache(hm.model, hm.params, ids)[0])
  got, want = (attribution.stream_attribution(hm, ids)['bias'],
               attribution.stream_attribution(hm.model, hm.params, ids)['bias'])
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(tracing.trace(hm, ids).logits, tracing.trace(hm.model, hm.params, ids).logits)
  assert circuits.program(hm, ids) == circuits.program(hm.model, hm.params, ids)
