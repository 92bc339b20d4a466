"""Activation patching against what it must give: the clean run where everything is patched, the existing
patch interventions for one head, and exactly full recovery where the last position's final state is
patched."""

import jax
import numpy as np
import pytest
from helpers import KINDS, compilations, randomize, shapes_of, small

from symjax.interpret import HookedModel, core, engine, hooks, interventions, patching, suffix
from symjax.model import Transformer
from symjax.system.errors import InputError


def setup(kind, **overrides):
  cfg = small(kind=kind, **overrides)
  model = Transformer(cfg)
  clean = np.asarray(jax.random.randint(jax.random.key(3), (1, 8), 0, cfg.vocab_size))
  corrupt = clean.copy()
  corrupt[0, 2] = (corrupt[0, 2] + 5) % cfg.vocab_size
  params = randomize(shapes_of(model, clean)['params'], 4)
  return model, params, clean, corrupt


@pytest.mark.parametrize('kind', KINDS)
def test_patching_a_whole_state_gives_the_clean_run_and_one_head_equals_the_patch_intervention(kind):
  model, params, clean, corrupt = setup(kind)
  clean_logits = hooks.run_with_hooks(model, params, clean, {})
  last = ['blocks.1.resid'] if kind == 'standard' else ['blocks.1.x_t', 'blocks.1.x_e']
  np.testing.assert_allclose(patching.patch(model, params, clean, corrupt, last), clean_logits, rtol=1e-5,
                             atol=1e-5)
  want, _ = interventions.run_with(model, params, corrupt, [interventions.Ablation('head', 0, 1, mode='patch')],
                                   source=clean)
  got = patching.patch(model, params, clean, corrupt, 'blocks.0.attn.z', heads=1)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  # Positions and heads together patch their product, and nothing else: the same as a hook writing it.
  _, clean_cache = hooks.run_with_cache(model, params, clean, ['blocks.0.attn.pattern'])
  source = clean_cache['blocks.0.attn.pattern']
  product = lambda v, name: v.at[:, [0, 2], 5].set(source[:, [0, 2], 5])
  want = hooks.run_with_hooks(model, params, corrupt, {'blocks.0.attn.pattern': product})
  got = patching.patch(model, params, clean, corrupt, 'blocks.0.attn.pattern', positions=[5], heads=[0, 2])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert np.abs(got - hooks.run_with_hooks(model, params, corrupt, {})).max() > 1e-4  # the patch changed them


@pytest.mark.parametrize('kind', ['standard', 'symbolic'])
def test_sweeps_measure_the_logit_difference_recovered(kind):
  model, params, clean, corrupt = setup(kind)
  logits = np.asarray(hooks.run_with_hooks(model, params, clean, {}))[0, -1]
  answer = int(np.argmax(logits))
  # The wrong token whose logit difference the corruption moves most: recovery is a ratio over that move, which
  # random weights can make as small as 1e-4, where float32's rounding of the logits is 0.1% of it.
  corrupted = np.asarray(hooks.run_with_hooks(model, params, corrupt, {}))[0, -1]
  moved = np.abs((logits[answer] - logits) - (corrupted[answer] - corrupted))
  moved[answer] = -1.0
  target = dict(answer=answer, wrong=int(np.argmax(moved)))
  by_position = patching.sweep_positions(model, params, clean, corrupt, **target)
  assert by_position.values.shape == (model.config.num_layers, clean.shape[1])
  # The last block's state at the last position decides the last logits: patched, all is recovered, up to
  # float32 rounding of the logit difference (1e-5) over the move it is divided by.
  assert by_position.values[-1, -1] == pytest.approx(1.0, abs=1e-5 / float(moved.max()))
  # Before the corrupted token nothing differs between the runs, so patching there recovers nothing.
  np.testing.assert_allclose(by_position.values[:, :2], 0.0, atol=1e-4)
  by_head = patching.sweep_heads(model, params, clean, corrupt, **target)
  assert by_head.values.shape == (model.config.num_layers, model.config.num_heads)
  assert np.all(np.isfinite(by_head.values))
  fig = by_head.figure()
  ax = fig.axes[0]
  assert ax.get_title() == 'patching attn.z per head: fraction of logit difference recovered'
  assert len(ax.texts) == by_head.values.size  # each cell's value is written in it
  low, high = ax.images[0].get_clim()  # the scale is symmetric about 0 and as wide as the values
  assert low == -high and high == pytest.approx(np.abs(by_head.values).max())
  custom = patching.sweep_heads(model, params, clean, corrupt, metric=lambda logits: float(logits[0, -1, 0]))
  assert custom.values.shape == by_head.values.shape
  assert custom.figure().axes[0].get_title() == 'patching attn.z per head: metric'


def test_patching_errors_are_one_line():
  model, params, clean, corrupt = setup('symbolic')
  with pytest.raises(InputError, match=r'same shape to patch position by position: \(1, 8\) vs \(1, 7\)'):
    patching.patch(model, params, clean, corrupt[:, :7], 'blocks.0.x_t')
  with pytest.raises(InputError, match=r'heads \[3\] are out of range: the model has heads 0..2'):
    patching.patch(model, params, clean, corrupt, 'blocks.0.attn.z', heads=3)
  with pytest.raises(InputError, match=r'positions \[8\] are outside the input of 8 tokens'):
    patching.patch(model, params, clean, corrupt, 'blocks.0.x_t', positions=8)
  with pytest.raises(InputError, match='blocks.0.x_t has no head axis'):
    patching.patch(model, params, clean, corrupt, 'blocks.0.x_t', heads=0)
  with pytest.raises(InputError, match="unknown site name 'blocks.0.attn.zz'"):
    patching.patch(model, params, clean, corrupt, 'blocks.0.attn.zz')
  with pytest.raises(InputError, match=r'every site needs one mask per patch; got \[1, 2\] masks'):
    patching.patch_many(model, params, clean, corrupt, {'blocks.0.x_t': np.ones((1, 1, 8, 1), bool),
                                                        'blocks.0.x_e': np.ones((2, 1, 8, 1), bool)})
  with pytest.raises(InputError, match='predict the same token'):
    patching.sweep_heads(model, params, clean, clean)
  logits = np.zeros((2, 8, 11))  # [batch, time, vocab]
  for metric, message in [(patching.logit_difference(11, 0), r'answer 11 is out of range; allowed 0..10'),
                          (patching.logit_difference(1, -1), r'wrong -1 is out of range; allowed 0..10'),
                          (patching.logit_difference(1, 0, position=8), r'position 8 is out of range; allowed -8..7'),
                          (patching.logit_difference([1, 2, 3], 0), r'answer gives 3 values for a batch of 2'),
                          (patching.logit_difference(1, 0, batch=2), r'batch=2 is out of range for a batch of 2')]:
    with pytest.raises(InputError, match=message):
      metric(logits)


def two_pairs(kind, **overrides):
  """Two prompt pairs of 8 tokens; the second pair corrupts another position, so it recovers differently."""
  model, params, clean, corrupt = setup(kind, **overrides)
  clean2 = np.asarray(jax.random.randint(jax.random.key(7), (1, 8), 0, model.config.vocab_size))
  corrupt2 = clean2.copy()
  corrupt2[0, 5] = (corrupt2[0, 5] + 3) % model.config.vocab_size
  return model, params, np.concatenate([clean, clean2]), np.concatenate([corrupt, corrupt2])


@pytest.mark.parametrize('kind,symbolic_layers', [(k, None) for k in KINDS] + [('symbolic', (1,))])
def test_sweeps_recomputing_only_the_suffix_equal_whole_hooked_passes(kind, symbolic_layers):
  """A causal model's sweeps recompute only the blocks and positions a patch can change, and skip the
  patches that change nothing: each value equals the whole pass with the clean value written in by a hook.
  One pair is corrupted at position 0 (every patch computed), the other at 5 (the earlier ones skipped).
  Blocks of one kind share one program; blocks of two kinds (``symbolic_layers``) run a program each."""
  model, params, clean, corrupt = two_pairs(kind, symbolic_layers=symbolic_layers)
  corrupt = corrupt.copy()
  corrupt[0, 0] = (corrupt[0, 0] + 1) % model.config.vocab_size
  metric = patching.logit_difference(1, 2)
  pre = patching.get_act_patch_resid_pre(model, params, clean, corrupt, metric)
  heads = patching.get_act_patch_attn_head_out_all_pos(model, params, clean, corrupt, metric)
  _, cache = hooks.run_with_cache(model, params, clean)

  def whole(sites, where):
    fns = {s: (lambda v, name, s=s: v.at[where].set(cache[s][where])) for s in sites}
    return metric(hooks.run_with_hooks(model, params, corrupt, fns))
  for l in range(model.config.num_layers):
    for p in (0, 3, 6):
      np.testing.assert_allclose(pre[l, p], whole(patching._resid_pre(model, l), (slice(None), p)), rtol=0,
                                 atol=2e-5, err_msg=f'resid_pre, block {l}, position {p}')
    np.testing.assert_allclose(heads[l, 1], whole([f'blocks.{l}.attn.z'], (slice(None), slice(None), 1)), rtol=0,
                               atol=2e-5, err_msg=f'head 1 of block {l}')


@pytest.mark.parametrize('kind', KINDS)
def test_a_metric_naming_its_positions_is_computed_there_alone_with_the_same_values(kind):
  """``logit_difference`` names the positions it reads: a sweep then runs the last block over the others only as
  far as its keys and values, and leaves their logits NaN. The values equal those of the same metric without
  the names (every position computed)."""
  model, params, clean, corrupt = two_pairs(kind)
  corrupt = corrupt.copy()
  corrupt[:, 0] = (corrupt[:, 0] + 1) % model.config.vocab_size  # every patch from position 0
  named = patching.logit_difference(1, 2, position=[6, 7])
  plain = lambda logits: named(logits)
  # The heads of every block, and the last block's output state (a patch after its split).
  for sweep in (patching.get_act_patch_attn_head_out_all_pos, patching.get_act_patch_resid_post):
    np.testing.assert_allclose(sweep(model, params, clean, corrupt, named),
                               sweep(model, params, clean, corrupt, plain), rtol=0, atol=1e-6,
                               err_msg=sweep.__name__)

  def unread(logits):  # 1 where position 5, before the metric's first, was not computed
    return float(np.isnan(logits[:, 5]).all())
  unread.positions = [6, 7]
  assert patching.sweep_heads(model, params, clean, corrupt, metric=unread).values.min() == 1.0
  assert patching.sweep_heads(model, params, clean, corrupt, metric=lambda x: unread(x)).values.max() == 0.0


@pytest.mark.parametrize('kind', KINDS)
def test_a_sweep_scores_every_prompt_pair_of_the_batch(kind):
  model, params, clean, corrupt = two_pairs(kind)
  both = patching.sweep_heads(model, params, clean, corrupt, metric=patching.logit_difference(1, 2))
  rows = [patching.sweep_heads(model, params, clean[i:i + 1], corrupt[i:i + 1],
                               metric=patching.logit_difference(1, 2)).values for i in range(2)]
  np.testing.assert_allclose(both.values, (rows[0] + rows[1]) / 2, rtol=1e-5, atol=1e-6)  # the mean of the pairs
  assert np.abs(both.values - rows[0]).max() > 1e-4  # not the first pair alone
  per_row = patching.patch(model, params, clean, corrupt, 'blocks.0.attn.z', heads=0,
                           metric=patching.logit_difference(1, 2, reduce='none'))
  assert per_row.shape == (2,) and np.isclose(per_row.mean(), both.values[0, 0], atol=1e-6)


@pytest.mark.parametrize('kind', KINDS)
def test_prompts_of_unequal_length_patch_as_when_they_stand_alone(kind):
  """A pair of 5 tokens padded to 8 beside a pair of 8, with the key mask: its patched metric at its last real
  position equals that of the 5-token pair run alone (the models are causal: padding after it changes
  nothing before it)."""
  model, params, clean, corrupt = two_pairs(kind)
  short_clean, short_corrupt = clean[:1, :5], corrupt[:1, :5]
  key_mask = np.ones(clean.shape, bool)
  key_mask[0, 5:] = False
  metric = patching.logit_difference(3, 4, position=[4, 7], reduce='none')
  padded = patching.patch(model, params, clean, corrupt, 'blocks.0.attn.z', heads=1, metric=metric,
                          key_mask=key_mask)
  alone = patching.patch(model, params, short_clean, short_corrupt, 'blocks.0.attn.z', heads=1,
                         metric=patching.logit_difference(3, 4, position=4))
  np.testing.assert_allclose(padded[0], alone, rtol=1e-5, atol=1e-5)
  sweep = patching.sweep_positions(model, params, clean, corrupt, key_mask=key_mask,
                                   metric=patching.logit_difference(3, 4, position=[4, 7]))
  assert sweep.values.shape == (model.config.num_layers, 8) and np.isfinite(sweep.values).all()
  with pytest.raises(InputError, match=r"key_mask must have the prompts' shape \(2, 8\)"):
    patching.patch(model, params, clean, corrupt, 'blocks.0.attn.z', key_mask=key_mask[:, :5])


@pytest.mark.parametrize('kind', KINDS)
def test_a_compiled_sweep_equals_the_loop_of_single_patches(kind):
  """Every patch of a sweep runs in one compiled program, and a single patch in the same program: the loop of
  ``patch`` equals the sweep to 1e-6 for a metric that is a plain logit difference."""
  model, params, clean, corrupt = two_pairs(kind)
  cfg = model.config
  metric = patching.logit_difference(1, 2)
  heads = patching.sweep_heads(model, params, clean, corrupt, metric=metric)
  loop = [[patching.patch(model, params, clean, corrupt, f'blocks.{l}.attn.z', heads=h, metric=metric)
           for h in range(cfg.num_heads)] for l in range(cfg.num_layers)]
  np.testing.assert_allclose(heads.values, loop, rtol=0, atol=1e-6)
  streams = ['resid'] if kind == 'standard' else ['x_t', 'x_e']
  positions = patching.sweep_positions(model, params, clean, corrupt, metric=metric)
  loop = [[patching.patch(model, params, clean, corrupt, [f'blocks.{l}.{s}' for s in streams], positions=p,
                          metric=metric) for p in range(clean.shape[1])] for l in range(cfg.num_layers)]
  np.testing.assert_allclose(positions.values, loop, rtol=0, atol=1e-6)
  site = 'blocks.1.attn.z'
  _, cache = hooks.run_with_cache(model, params, clean, [site])
  masks = {site: patching._one_hot(cache[site].shape, 2, cfg.num_heads)}
  many = patching.patch_many(model, params, clean, corrupt, masks, chunk=2)  # two calls: one program, reused
  for h in range(cfg.num_heads):
    np.testing.assert_allclose(many[h], patching.patch(model, params, clean, corrupt, site, heads=h), atol=1e-6)


def test_a_loop_of_single_patches_over_blocks_and_heads_compiles_once():
  """``patch`` hooks its site in every block, unpatched where not asked: a loop over the blocks and heads of
  ``attn.z`` compiles one program (compilations counted, not seconds), and each patch gives the value of its own
  block and head (that of the hooked pass writing the clean head in)."""
  model, params, clean, corrupt = setup('standard', vocab_size=19)
  cfg = model.config
  patching.patch(model, params, clean, corrupt, 'blocks.0.attn.q', heads=0)  # stages the inputs' shapes once
  with compilations() as count:
    loop = [[patching.patch(model, params, clean, corrupt, f'blocks.{l}.attn.z', heads=h)
             for h in range(cfg.num_heads)] for l in range(cfg.num_layers)]
  assert count() == 1, count()
  _, cache = hooks.run_with_cache(model, params, clean)
  for l in range(cfg.num_layers):
    for h in range(cfg.num_heads):
      site = f'blocks.{l}.attn.z'
      whole = hooks.run_with_hooks(model, params, corrupt,
                                   {site: lambda v, name, h=h, site=site: v.at[:, :, h].set(cache[site][:, :, h])})
      np.testing.assert_allclose(loop[l][h], whole, rtol=0, atol=2e-5, err_msg=f'block {l}, head {h}')
  assert np.abs(loop[0][0] - loop[1][0]).max() > 1e-4  # the blocks' patches differ


@pytest.mark.parametrize('kind', KINDS)
def test_a_sweep_split_into_calls_runs_them_through_one_program_per_start(kind):
  """Patches beyond a call's limit are split evenly over the blocks, so that every call of a start runs the
  same compiled program, and the values equal the sweep in one call."""
  model, params, clean, corrupt = setup(kind)
  analysis = core.analysis_model(model)
  groups = patching._heads_by_position(model, clean.shape[1],
                                       [f'blocks.{l}.attn.z' for l in range(model.config.num_layers)])
  whole = suffix.run(analysis, params, clean, corrupt, None, groups)[2]
  kept = lambda: {k[1] for k in engine._PROGRAMS if k[0] == 'executable'}
  before = kept()
  split = suffix.run(analysis, params, clean, corrupt, None, groups, limit=4)[2]
  waves = sorted(k[3] for k in kept() - before if k[0] == 'wave')  # each program's start
  width = -(-clean.shape[1] // suffix.BUCKETS)
  assert waves == list(range(2 // width * width, clean.shape[1], width))  # corrupted at position 2
  np.testing.assert_allclose(split, whole, rtol=0, atol=1e-6)


@pytest.mark.parametrize('kind', KINDS)
def test_transformer_lens_families_patch_the_sites_they_name(kind):
  """``get_act_patch_*``: the state before block l+1 is the state after block l; the state before block 0
  is the embedding; the mid state of a two-stream block holds X_t after the attention and X_e before the
  FFN; each family's entry equals the single patch of its site; a HookedModel stands for (model, params)."""
  model, params, clean, corrupt = two_pairs(kind)
  cfg = model.config
  metric = patching.logit_difference(1, 2)
  pre = patching.get_act_patch_resid_pre(model, params, clean, corrupt, metric)
  post = patching.get_act_patch_resid_post(model, params, clean, corrupt, metric)
  assert pre.shape == post.shape == (cfg.num_layers, clean.shape[1])
  np.testing.assert_allclose(pre[1:], post[:-1], rtol=0, atol=1e-6)
  np.testing.assert_allclose(pre[0, 3], patching.patch(model, params, clean, corrupt, 'embed', positions=3,
                                                       metric=metric), atol=1e-6)
  np.testing.assert_allclose(post, patching.sweep_positions(model, params, clean, corrupt, metric=metric).values,
                             atol=1e-6)
  mid = patching.get_act_patch_resid_mid(model, params, clean, corrupt, metric)
  mid_sites = ['blocks.1.resid_mid'] if kind == 'standard' else ['blocks.1.x_t_mid', 'blocks.1.x_e_mid']
  np.testing.assert_allclose(mid[1, 6], patching.patch(model, params, clean, corrupt, mid_sites, positions=6,
                                                       metric=metric), atol=1e-6)
  _, cache = hooks.run_with_cache(model, params, clean)
  if kind != 'standard':  # the attention writes X_t only, the FFN X_e only
    np.testing.assert_array_equal(cache['blocks.1.x_t_mid'], cache['blocks.1.x_t'])
    np.testing.assert_array_equal(cache['blocks.1.x_e_mid'], cache['blocks.0.x_e'])
  else:
    np.testing.assert_allclose(cache['blocks.1.resid_mid'], cache['blocks.0.resid'] + cache['blocks.1.attn.out'],
                               rtol=1e-5, atol=1e-5)
  attn, ffn = (patching.get_act_patch_attn_out(model, params, clean, corrupt, metric),
               patching.get_act_patch_mlp_out(model, params, clean, corrupt, metric))
  np.testing.assert_allclose(attn[0, 4], patching.patch(model, params, clean, corrupt, 'blocks.0.attn.out',
                                                        positions=4, metric=metric), atol=1e-6)
  np.testing.assert_allclose(ffn[1, 7], patching.patch(model, params, clean, corrupt, 'blocks.1.ffn.out',
                                                       positions=7, metric=metric), atol=1e-6)
  every = patching.get_act_patch_block_every(model, params, clean, corrupt, metric)
  np.testing.assert_allclose(every, np.stack([pre, attn, ffn]), atol=1e-6)
  by_pos = patching.get_act_patch_attn_head_out_by_pos(model, params, clean, corrupt, metric)
  assert by_pos.shape == (cfg.num_layers, clean.shape[1], cfg.num_heads)
  np.testing.assert_allclose(by_pos[1, 5, 2], patching.patch(model, params, clean, corrupt, 'blocks.1.attn.z',
                                                             positions=5, heads=2, metric=metric), atol=1e-6)
  # Before either pair's corrupted token (positions 0 and 1) nothing differs: the corrupt run's own metric.
  np.testing.assert_allclose(by_pos[:, :2], metric(hooks.run_with_hooks(model, params, corrupt, {})), atol=1e-5)
  if kind == 'symbolic':  # a channel FFN's hidden units are [heads, batch·time, ff]: patched whole
    _, hidden = hooks.run_with_cache(model, params, clean, ['blocks.0.ffn.hidden'])
    site = 'blocks.0.ffn.hidden'
    want = hooks.run_with_hooks(model, params, corrupt, {site: lambda v, n: hidden[site]})
    np.testing.assert_allclose(patching.patch(model, params, clean, corrupt, 'blocks.0.ffn.hidden'), want, atol=1e-5)
  all_pos = patching.get_act_patch_attn_head_out_all_pos(model, params, clean, corrupt, metric)
  hm = HookedModel(model, params)
  np.testing.assert_array_equal(all_pos, patching.get_act_patch_attn_head_out_all_pos(hm, clean, corrupt, metric))
  np.testing.assert_array_equal(all_pos, patching.sweep_heads(hm, clean, corrupt, metric=metric).values)


def test_a_logit_difference_scores_many_patches_at_once_as_one_at_a_time():
  """Sweeps score all their patches in one call of ``logit_difference``'s ``each``: per patch, the metric of
  its logits, written out here row by row, for every reduction and a position per row."""
  patched = np.random.default_rng(0).normal(size=(5, 3, 7, 11)).astype(np.float32)
  answer, wrong = [1, 2, 3], 4
  for kwargs in ({}, {'reduce': 'none'}, {'batch': 1}, {'position': [6, 4, 5]}):
    at = kwargs.get('position', [-1] * 3)
    rows = np.array([[p[r, at[r], answer[r]] - p[r, at[r], wrong] for r in range(3)] for p in patched])
    want = rows[:, 1] if 'batch' in kwargs else rows if 'reduce' in kwargs else rows.mean(1)
    metric = patching.logit_difference(answer, wrong, **kwargs)
    np.testing.assert_allclose(metric.each(patched), want, rtol=1e-6, err_msg=str(kwargs))
    np.testing.assert_allclose(np.array([metric(p) for p in patched]), want, rtol=1e-6, err_msg=str(kwargs))


@pytest.mark.parametrize('kind', ['standard', 'symbolic'])
def test_a_sweep_scored_by_a_users_jnp_metric_equals_logit_difference_and_reads_its_positions(kind):
  """A lambda of the logits is traced: the positions it reads are found (the last one here), and its sweep
  gives logit_difference's values; a metric reading every position reads from 0."""
  model, params, clean, corrupt = setup(kind)
  ld = patching.logit_difference(3, 4)
  user = lambda logits: (logits[:, -1, 3] - logits[:, -1, 4]).mean()
  assert patching.metric_reads_from(user, (1, 8, 13)) == 7
  assert patching.metric_reads_from(lambda l: l[:, 5:, 2].sum(), (1, 8, 13)) == 5
  assert patching.metric_reads_from(lambda l: l.sum(), (1, 8, 13)) is None
  for family in (patching.get_act_patch_attn_head_out_all_pos, patching.get_act_patch_resid_pre,
                 patching.get_act_patch_attn_head_out_by_pos):
    want = family(model, params, clean, corrupt, metric=ld)
    np.testing.assert_allclose(family(model, params, clean, corrupt, metric=user), want, rtol=0, atol=1e-6)
    assert np.abs(want).max() > 1e-3
  with pytest.raises(InputError, match=r'one number per patch; it returned shape \(1,\)'):
    patching.sweep_heads(model, params, clean, corrupt, metric=lambda logits: logits[:, -1, 3])


@pytest.mark.parametrize('kind', ['standard', 'token_factored'])
def test_a_hook_over_a_grid_of_its_arguments_equals_the_loop_of_single_runs(kind):
  """sweep_hooks over layers × heads (a TransformerLens in-place hook, the layer chosen by the site) gives the
  loss, logits and metric of each hooked run; bad grids and metrics are one-line errors."""
  model, params, clean, _ = setup(kind)
  cfg = model.config
  hm = HookedModel(model, params)

  def ablate(z, hook, head):
    z[:, :, head, :] = 0.
  over = {'layer': range(cfg.num_layers), 'head': range(cfg.num_heads)}
  one = lambda l, h, **kw: hooks.run_with_hooks(
      model, params, clean, {f'blocks.{l}.attn.z': lambda z, n: ablate(z, n, h)}, **kw)
  losses = hm.sweep_hooks(clean, 'blocks.{layer}.attn.hook_z', ablate, over)
  want = np.array([[one(l, h, return_type='loss') for h in over['head']] for l in over['layer']])
  np.testing.assert_allclose(losses, want, rtol=1e-6, atol=1e-6)
  assert losses.shape == (cfg.num_layers, cfg.num_heads) and np.ptp(losses) > 1e-4
  logits = hm.sweep_hooks(clean, 'blocks.{layer}.attn.z', ablate, over, return_type='logits')
  np.testing.assert_allclose(logits[1, 2], one(1, 2), rtol=1e-6, atol=1e-6)
  metric = lambda logits: logits[:, -1, 3].mean()
  np.testing.assert_allclose(hm.sweep_hooks(clean, 'blocks.{layer}.attn.z', ablate, over, metric=metric),
                             logits[..., 0, -1, 3], rtol=1e-6, atol=1e-6)
  with pytest.raises(InputError, match="over names 'hed', which is neither a field of the site"):
    hm.sweep_hooks(clean, 'blocks.{layer}.attn.z', ablate, {'layer': [0], 'hed': [0]})
  with pytest.raises(InputError, match=r'one number per setting; it returned shape \(1, 13\)'):
    hm.sweep_hooks(clean, 'blocks.{layer}.attn.z', ablate, over, metric=lambda logits: logits[:, -1])
  with pytest.raises(InputError, match="the site 'blocks.{lyr}.attn.z' names 'lyr'"):
    hm.sweep_hooks(clean, 'blocks.{lyr}.attn.z', ablate, over)
  with pytest.raises(InputError, match='returned shape'):
    hm.sweep_hooks(clean, 'blocks.{layer}.attn.z', lambda z, hook, head: z[..., 0], over)
