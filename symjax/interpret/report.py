"""Figures (matplotlib) and a self-contained HTML report of one input: the prediction, the program view,
the induction circuit, attention heatmaps per layer and head, W_head matrices, ALiBi slopes and τ per
head, lens tables, stream attribution and token importance. Images are embedded as PNG data URIs, so the
file can be mailed or opened anywhere."""

from __future__ import annotations

import base64
import html
import io
import os
from typing import Callable

import numpy as np

# Figures are built as plain `Figure` objects, outside pyplot: importing this module leaves the session's
# backend alone (notebooks keep their inline figures), and the report renders PNGs without a display.
from matplotlib.figure import Figure

from symjax.interpret import attribution, circuits, core, mixtures, tracing
from symjax.interpret.patterns import attention_figure
from symjax.system import files
from symjax.system.errors import InputError


def head_parameter_figure(heads: core.HeadParameters):
  """W_head matrices per layer, ALiBi slopes and τ per head."""
  L = heads.tau_value.shape[0]
  panels = (L if heads.w_head is not None else 0) + 2
  fig = Figure(figsize=(2.6 * panels, 2.6))
  axes = fig.subplots(1, panels, squeeze=False)
  axes = axes[0]
  k = 0
  if heads.w_head is not None:
    lim = max(np.abs(heads.w_head).max(), 1e-6)
    for l in range(L):
      im = axes[k].imshow(heads.w_head[l], cmap='RdBu_r', vmin=-lim, vmax=lim)
      axes[k].set_title(f'W_head, layer {l}', fontsize=9)
      axes[k].set_xlabel('from channel', fontsize=8)
      axes[k].set_ylabel('to head', fontsize=8)
      k += 1
    fig.colorbar(im, ax=axes[k - 1], fraction=0.046)
  H = heads.tau_value.shape[1]
  width = 0.8 / L
  for l in range(L):
    if heads.slopes is not None:
      axes[k].bar(np.arange(H) + l * width, heads.slopes[l], width, label=f'layer {l}')
    axes[k + 1].bar(np.arange(H) + l * width, heads.tau_value[l], width, label=f'value, layer {l}')
    axes[k + 1].bar(np.arange(H) + l * width, heads.tau_ffn[l], width * 0.4, label=f'FFN, layer {l}')
  axes[k].set_title('ALiBi slopes m_h' if heads.slopes is not None else 'no ALiBi (learned positions)', fontsize=9)
  axes[k + 1].set_title('τ_h (symbolic layers)' if np.isfinite(heads.tau_value).any() else 'no τ (not symbolic)',
                        fontsize=9)
  for ax in axes[k:k + 2]:
    ax.set_xlabel('head', fontsize=8)
    ax.set_xticks(range(H))
    if ax.has_data():
      ax.legend(fontsize=6)
  fig.tight_layout()
  return fig


def bars_figure(values: dict[str, np.ndarray], labels: list[str], title: str):
  """One bar chart per entry of ``values`` (each ``[len(labels)]``), side by side."""
  n = len(values)
  fig = Figure(figsize=(max(3.0, 0.35 * len(labels)) * n, 2.6))
  axes = fig.subplots(1, n, squeeze=False)
  for ax, (name, v) in zip(axes[0], values.items()):
    ax.bar(range(len(labels)), v, color='tab:purple')
    ax.set_title(name, fontsize=9)
    ax.set_xticks(range(len(labels)), labels, fontsize=7, rotation=90)
  fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  return fig


def figure_to_uri(fig) -> str:
  buf = io.BytesIO()
  fig.savefig(buf, format='png', dpi=110)
  return 'data:image/png;base64,' + base64.b64encode(buf.getvalue()).decode()


def _table(header: list[str], rows: list[list[str]]) -> str:
  head = ''.join(f'<th>{html.escape(h)}</th>' for h in header)
  body = ''.join('<tr>' + ''.join(f'<td>{html.escape(str(c))}</td>' for c in r) + '</tr>' for r in rows)
  return f'<table><tr>{head}</tr>{body}</table>'


STYLE = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;color:#222}
table{border-collapse:collapse;font-size:12px;margin:0.5em 0}td,th{border:1px solid #ccc;padding:2px 6px}
th{background:#f3f3f3}pre{background:#f7f7f7;padding:0.6em;font-size:12px;overflow-x:auto}
img{max-width:100%}h2{border-bottom:1px solid #ddd}"""


@core.takes_hooked_model
def build_report(model, params, tokens, decode: Callable, title: str = 'symjax report',
                 position: int = -1, target: int | None = None, ignore=frozenset(),
                 ig_steps: int = 128, circuit: circuits.Circuit | None = None,
                 circuit_source: str = 'this input') -> str:
  """The HTML of the report for one sequence ``tokens`` ``[time]``. ``position``: the query position whose
  prediction is attributed (default: the last); ``target``: the token whose log-probability the gradient
  methods explain (default: the model's prediction). ``ignore``: token ids that are never induction queries.
  ``circuit``: heads found elsewhere (e.g. on a test split, named by ``circuit_source``); by default they
  are scored on this input.
  """
  tokens = core.as_batch(tokens, model.config.vocab_size)
  if tokens.shape[0] != 1:
    raise InputError('the report reads one sequence')
  model = core.analysis_model(model)
  cfg = model.config
  decode = core.visible(decode)  # a space or a line end is a token too: never a blank cell
  t = tokens.shape[1]
  pos = position % t
  labels = [f'{i}:{decode([int(v)])}' for i, v in enumerate(tokens[0])]
  tr = tracing.trace(model, params, tokens)
  pred = tr.logits[0].argmax(-1)
  target = int(pred[pos]) if target is None else int(target)
  parts = [explorer(tr, tokens[0], decode, cfg), _prediction_section(tr, tokens, decode)]
  parts += _heads_sections(model, params, tokens, tr, labels, ignore, circuit, circuit_source)
  parts.append('<h2>Program view</h2><pre>' + html.escape(
      circuits.format_program(circuits.program(model, params, tokens), tokens, decode)) + '</pre>')
  parts.append(f'<h2>Per-head parameters</h2><img src="{figure_to_uri(head_parameter_figure(tr.heads))}">')
  parts += _stream_sections(tr, params, cfg, labels, pos, decode)
  parts.append(_attribution_section(model, params, tokens, labels, target, decode))
  parts.append(_importance_section(model, params, tokens, labels, pos, target, decode, ig_steps))
  summary = (f'{cfg.kind} model, {cfg.num_layers} layers × {cfg.num_heads} heads of {cfg.head_dim}, '
             f'vocabulary {cfg.vocab_size}') + _variant_summary(cfg)
  return (f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
          f'<style>{STYLE}{EXPLORER_STYLE}</style></head><body><h1>{html.escape(title)}</h1><p>{html.escape(summary)}</p>'
          + '\n'.join(parts) + '</body></html>')


EXPLORER_STYLE = """
#tokens{display:flex;flex-wrap:wrap;line-height:2em;font-family:ui-monospace,monospace;font-size:13px}
.tok{padding:2px 4px;margin:1px;border:1px solid #ccc;border-radius:3px;cursor:pointer;white-space:pre}
.tok.on{background:#ffe08a;border-color:#c90}
#detail{display:flex;flex-wrap:wrap;gap:10px;margin:0.6em 0}.state{border:1px solid #ddd;padding:4px 6px}
.state h4{margin:0 0 4px 0;font-size:12px}.head{display:inline-block;vertical-align:top;margin-right:8px;width:170px}
.bar{font:11px ui-monospace,monospace;display:flex;align-items:center;gap:4px;height:15px}
.bar span.w{display:inline-block;height:10px;background:#4a7bd0}.bar.lens span.w{background:#aaa}
#attn{overflow:auto;max-height:640px;max-width:100%;border:1px solid #ddd}
#attn table{font:10px ui-monospace,monospace}#attn td{width:14px;height:14px;padding:0;border:0}
#attn th{font-weight:normal;white-space:pre;padding:0 3px}#attn thead th{writing-mode:vertical-rl;height:60px}
"""

EXPLORER_SCRIPT = """
const D = JSON.parse(document.getElementById('explorer-data').textContent);
function bars(list, lens) {
  return list.map(([tok, w]) => `<div class="bar${lens ? ' lens' : ''}">` +
    `<span class="w" style="width:${Math.round(60 * w)}px"></span><span class="t">${tok}</span> ${w.toFixed(2)}</div>`
  ).join('');
}
function show(pos) {
  document.querySelectorAll('.tok').forEach(el => el.classList.toggle('on', +el.dataset.pos === pos));
  let html = '';
  for (const s of D.states) {
    html += `<div class="state" data-state="${s.name}"><h4>${s.name} — position ${pos} ${D.labels[pos]}</h4>`;
    s.heads[pos].forEach((h, i) => {
      const exact = h.exact ? '<div class="exact">' + bars(h.exact, false) + '</div>' : '';
      const lens = `<div class="lens"><i>lens</i>${bars(h.lens, true)}</div>`;
      html += `<div class="head"><b>head ${i}</b>${exact}${lens}</div>`;
    });
    html += '</div>';
  }
  document.getElementById('detail').innerHTML = html;
}
function attention(which) {
  const A = D.attention[which], n = D.labels.length;
  let html = '<table><thead><tr><th></th>' + D.labels.map(l => `<th>${l}</th>`).join('') + '</tr></thead><tbody>';
  for (let q = 0; q < n; q++) {
    html += `<tr><th>${D.labels[q]}</th>` + A[q].map((w, k) => `<td title="${D.labels[q]} → ${D.labels[k]}: ` +
      `${w.toFixed(3)}" style="background:rgba(200,40,40,${w})"></td>`).join('') + '</tr>';
  }
  document.getElementById('attn').innerHTML = html + '</tbody></table>';
}
document.querySelectorAll('.tok').forEach(el => {
  el.addEventListener('mouseenter', () => show(+el.dataset.pos));
  el.addEventListener('click', () => show(+el.dataset.pos));
});
document.getElementById('head').addEventListener('change', e => attention(e.target.value));
show(D.labels.length - 1);
attention(document.getElementById('head').value);
"""



def _prediction_section(tr, tokens, decode) -> str:
  pred, probs = tr.logits[0].argmax(-1), core.softmax(tr.logits[0])
  return '<h2>Input and prediction</h2>' + _table(
      ['position', 'token', 'prediction', 'p'],
      [[i, decode([int(tokens[0, i])]), decode([int(pred[i])]), f'{probs[i, pred[i]]:.3f}']
       for i in range(tokens.shape[1])])


def _heads_sections(model, params, tokens, tr, labels, ignore, circuit, circuit_source) -> list[str]:
  """The previous-token and induction heads, named only where the input can show them, with every head's
  scores; the attention heatmaps, the named heads starred."""
  cfg = model.config
  evidence = induction_evidence(tokens[0], ignore) if circuit is None else None
  if circuit is None:
    circuit = circuits.find_induction_circuit(model, params, tokens, ignore=ignore)
  named = circuit_source != 'this input' or (evidence > 0 and cfg.num_layers > 1 and circuit.induction_head[0] > 0)
  highlight = {circuit.previous_token_head, circuit.induction_head} if named else set()
  if named:
    on = (f'{html.escape(circuit_source)}' if evidence is None else
          f'this input: {evidence} position(s) repeat an earlier token that has a successor')
    heads_text = html.escape(circuit.describe()) + f' — scored on {on}; starred in the heatmaps.'
  else:
    heads_text = ('No head is named: an induction head needs a token repeated after an earlier occurrence with a '
                  'successor, read in a block after the first (a previous-token head must come before it); '
                  f'this input has {evidence} such position(s) and the model {cfg.num_layers} block(s). The scores '
                  'below are what each head does on this input, not a label.')
  parts = ['<h2>Heads</h2><p>' + heads_text + '</p>' + _table(
      ['layer.head', 'previous-token score', 'induction score'],
      [[f'L{l}.H{h}', f'{circuit.previous_token_scores[l, h]:.2f}', f'{circuit.induction_scores[l, h]:.2f}']
       for l in range(cfg.num_layers) for h in range(cfg.num_heads)])]
  if named:
    (pl, ph), (il, ih) = circuit.previous_token_head, circuit.induction_head
    pair = np.stack([tr.attention[pl, 0, ph], tr.attention[il, 0, ih]])[None]
    pair_titles = [[f'previous-token head L{pl}.H{ph}', f'induction head L{il}.H{ih}']]
    parts.append(f'<img src="{figure_to_uri(attention_figure(pair, labels, titles=pair_titles))}">')
  figure = figure_to_uri(attention_figure(tr.attention[:, 0], labels, highlight))
  return parts + [f'<h2>Attention</h2><img src="{figure}">']


def _stream_sections(tr, params, cfg, labels, pos, decode) -> list[str]:
  """What the streams hold: the exact mixtures (symbolic), the channel lens, the mixture trace's
  reconstruction error (symbolic) or the distance from the vocabulary cone (token-factored)."""
  parts = []
  if tr.mixture is not None:
    mix_html = []
    for l in range(len(tr.streams)):
      where = 'embed (the input)' if l == 0 else f'after block {l - 1}'
      for name in ('x_t', 'x_e'):
        if l == 0 and name == 'x_e':
          continue  # X_e⁰ = 0: no mixture to show
        weights = getattr(tr.mixture, name)[l][0, pos, :, :cfg.vocab_size]      # [heads, vocab]
        cells = [' / '.join(f'{decode([int(v)])} {weights[h, v]:.2f}' for v in np.argsort(-weights[h])[:3])
                 for h in range(cfg.num_heads)]
        mix_html.append([f'{where}, {name}'] + cells)
    parts.append(f'<h2>Exact mixtures at position {html.escape(labels[pos])}</h2><p>The weights w of each head '
                 'channel of X_t and X_e written exactly as Σ_v w_v E^(h)_v (the top three tokens): the model\'s own '
                 'coefficients, not a lens.</p>' + _table(['state'] + [f'head {h}' for h in range(cfg.num_heads)],
                                                          mix_html))
  lens_html = []
  for l in range(len(tr.streams)):
    for name in core.stream_names(cfg):
      rows = tr.lens_table(l, name, decode)
      where = 'embed (the input)' if l == 0 else f'after block {l - 1}'
      lens_html.append(f'<h3>{where}, {name}</h3>' + _table(
          ['position'] + [f'head {h}' for h in range(cfg.num_heads)],
          [[labels[i]] + r for i, r in enumerate(rows)]))
  parts.append('<h2>Channel lens</h2><p>A reading, not the model\'s weights: each head channel decoded through '
               'its embedding slice, softmax(x_h · E^(h) / τ_h), the top two tokens and their probabilities.</p>'
               + ''.join(lens_html))
  if tr.mixture is not None:
    errs = mixtures.reconstruction_errors(tr.mixture, core.embedding_table(params), cfg.num_heads)
    parts.append('<h2>Exact mixture trace</h2><p>Every channel of X_t and X_e written as Σ_v w_v E^(h)_v with '
                 'w ≥ 0 (Property 5.6); largest relative reconstruction error per layer: ' + html.escape(
                     ', '.join(f'{k}: {max(v):.1e}' for k, v in errs.items())) + '.</p>')
  if tr.cone_cosine is not None:
    rows = [[l] + [f'{c[name][0].mean():.2f}' for name in ('x_t', 'x_e', 'x')] for l, c in enumerate(tr.cone_cosine)]
    spans = spanning_channels(core.embedding_table(params), cfg)
    note = (f' The {cfg.vocab_size} token embeddings of channel(s) {spans} positively span their {cfg.head_dim}-'
            'dimensional space: every vector there is a non-negative token combination, so this check cannot '
            'tell a token mixture from anything else in those channels.' if spans else '')
    parts.append('<h2>Distance from the vocabulary cone</h2><p>Mean cosine between each channel state and its '
                 'nearest non-negative combination of the channel\'s token embeddings (1: a token mixture); '
                 'row 0 is the input, row l the state after block l − 1.' + note + '</p>'
                 + _table(['state', 'X_t', 'X_e', 'X'], rows))
  return parts


def _variant_summary(cfg) -> str:
  """The dual-stream family's options where they differ from the paper's (``model.streams``), e.g. '; stream
  cascade (attention and FFN write X_e), head mixing kronecker'."""
  s = cfg.streams
  if cfg.kind == 'standard':
    return ''
  parts = []
  if s.stream != 'token_factored':
    written = {'cascade': 'X_e', 'single': 'X_t'}[s.stream]
    parts.append(f'stream {s.stream} (attention and FFN write {written})')
  parts += [f'{name.replace("_", " ")} {getattr(s, name)}' for name, default in
            (('head_mixing', 'independent'), ('ffn_mixing', 'dense'), ('gate', 'none')) if getattr(s, name) != default]
  if cfg.symbolic.value_map in ('independent', 'dense'):
    parts.append(f'value map {cfg.symbolic.value_map}')
  if s.pls_weight:
    parts.append(f'per-layer supervision {s.pls_weight:g} ({s.pls_decay}, decoding {s.pls_source})')
  if cfg.attention.positions != 'alibi':
    parts.append(f'positions {cfg.attention.positions}')
  return ''.join('; ' + p for p in parts)


def _attribution_section(model, params, tokens, labels, target, decode) -> str:
  parts_attr = attribution.group_attribution(attribution.stream_attribution(model, params, tokens),
                                            model.config.kind != 'standard')
  values = {name: v[0, :, target] for name, v in parts_attr.items()}
  fig = bars_figure(values, labels, f'direct contribution to the logit of {decode([target])!r} at each position')
  return ('<h2>Stream attribution</h2><p>Logits = Σ of the terms below exactly, with the final '
          'normalisation\'s scale held at its value (direct logit attribution).</p>'
          f'<img src="{figure_to_uri(fig)}">')


def _importance_section(model, params, tokens, labels, pos, target, decode, ig_steps) -> str:
  targets = np.full(tokens.shape, target, np.int32)
  blocks = attribution.native_importance(model, params, tokens)[:, 0, pos]
  ig = attribution.gradient_importance(model, params, tokens, targets, None, 'integrated_gradients', ig_steps,
                                       signed=True)[0, pos]
  gap = ig.sum() - (attribution.target_logprob(model, params, tokens, targets)[0, pos]
                    - attribution.target_logprob(model, params, tokens, targets, baseline='mean')[0, pos])
  stream = 'X' if model.config.kind == 'standard' else {'x_t': 'X_t', 'x_e': 'X_e'}[model.config.writes('attention')]
  scores = {f'native ({stream} flow, last block)': blocks[-1], 'integrated gradients': ig,
            'input × gradient': attribution.gradient_importance(model, params, tokens, targets, None,
                                                                'input_x_gradient', signed=True)[0, pos]}
  scores.update({f'native, block {l}': blocks[l] for l in range(len(blocks) - 1)})
  fig = bars_figure(scores, labels, f'importance of each input token for position {labels[pos]} '
                                    f'(target {decode([target])!r})')
  return ('<h2>Token importance</h2><p>Native: the share of each input position in what the query '
          f'position holds after each block (flow through {stream}, which attention writes). Gradient methods: '
          'signed attribution '
          f'of log p(target); integrated gradients from the mean-embedding baseline in {ig_steps} steps '
          f'(completeness gap {gap:+.2e}).</p>' + f'<img src="{figure_to_uri(fig)}">')

def explorer(tr, tokens: np.ndarray, decode: Callable, cfg, k: int = 6) -> str:
  """The interactive part of the report: hover or click a token to see, after each block, the exact mixture
  of each head channel of X_t and X_e as ranked bars (the lens beside it, labelled), and every head's
  attention pattern as a scrollable grid with the tokens on both axes. Self-contained: data and script are
  in the page."""
  import json
  labels = [f'{i}:{decode([int(v)])}' for i, v in enumerate(tokens)]
  show = lambda ids: html.escape(decode([int(i) for i in ids]))  # the page inserts these as HTML: escaped
  t = len(tokens)
  states = []
  for l in range(len(tr.streams)):
    where = 'embed' if l == 0 else f'after block {l - 1}'
    for name in (('x_t', 'x_e') if cfg.kind != 'standard' else ('x',)):
      if l == 0 and name == 'x_e':
        continue
      lens_ids, lens_w = tr.top_tokens(l, name, k)
      exact = None if tr.mixture is None else getattr(tr.mixture, name)[l][0, :, :, :cfg.vocab_size]
      heads = []
      for i in range(t):
        row = []
        for h in range(cfg.num_heads):
          cell = {'lens': [[show([v]), round(float(w), 4)] for v, w in zip(lens_ids[0, i, h], lens_w[0, i, h])]}
          if exact is not None:
            top = np.argsort(-exact[i, h], kind='stable')[:k]
            cell['exact'] = [[show([v]), round(float(exact[i, h, v]), 4)] for v in top]
          row.append(cell)
        heads.append(row)
      states.append({'name': f'{where}, {name}', 'heads': heads})
  attention = {f'{l}.{h}': np.round(tr.attention[l, 0, h], 3).tolist()
               for l in range(cfg.num_layers) for h in range(cfg.num_heads)}
  data = json.dumps({'labels': [html.escape(label) for label in labels], 'states': states, 'attention': attention})
  data = data.replace('</', '<\\/')  # no '</script>' inside the script element
  options = ''.join(f'<option value="{l}.{h}">block {l}, head {h}</option>'
                    for l in range(cfg.num_layers) for h in range(cfg.num_heads))
  tokens_html = ''.join(f'<span class="tok" data-pos="{i}">{html.escape(label)}</span>'
                        for i, label in enumerate(labels))
  what = ('the exact mixture of each head channel (the model\'s own weights, blue) and the lens beside it (grey)'
          if tr.mixture is not None else 'the channel lens (a reading; this model has no exact mixtures)')
  return (f'<h2>Explore</h2><p>Hover or click a token: {what}, after each block. Below, any head\'s attention '
          'pattern (scroll; hover a cell for its weight).</p>'
          f'<div id="tokens">{tokens_html}</div><div id="detail"></div>'
          f'<p><label>attention of <select id="head">{options}</select></label></p><div id="attn"></div>'
          f'<script type="application/json" id="explorer-data">{data}</script><script>{EXPLORER_SCRIPT}</script>')


def induction_evidence(tokens: np.ndarray, ignore=frozenset()) -> int:
  """How many positions of ``tokens`` repeat an earlier token that has a successor: the positions where an
  induction head can show itself (attend to that successor)."""
  count = 0
  for i in range(1, len(tokens)):
    if int(tokens[i]) not in ignore and any(tokens[j] == tokens[i] for j in range(i - 1)):
      count += 1
  return count


def spanning_channels(table: np.ndarray, cfg) -> list[int]:
  """The head channels whose token embeddings positively span the channel's space (the cone is everything):
  the origin is strictly inside their convex hull, found as a strictly positive combination summing to 0 with
  full rank."""
  from scipy.optimize import linprog
  out = []
  for h in range(cfg.num_heads):
    e = np.asarray(table, np.float64)[:cfg.vocab_size, h * cfg.head_dim:(h + 1) * cfg.head_dim]
    if np.linalg.matrix_rank(e) < cfg.head_dim:
      continue
    v = e.shape[0]  # maximise the smallest weight s of Σ w_v e_v = 0, Σ w_v = 1, w_v >= s
    res = linprog(np.r_[np.zeros(v), -1.0], A_eq=np.c_[np.r_[e.T, np.ones((1, v))], np.r_[np.zeros(e.shape[1]), 0]],
                  b_eq=np.r_[np.zeros(e.shape[1]), 1.0], A_ub=np.c_[-np.eye(v), np.ones(v)], b_ub=np.zeros(v),
                  bounds=[(0, None)] * v + [(None, None)])
    if res.success and -res.fun > 1e-9:
      out.append(h)
  return out


def check_report_path(path: str) -> None:
  """Raises ValueError if ``path`` cannot take a report file (it is a folder)."""
  if os.path.isdir(path):
    raise InputError(f'the report path {path!r} is a folder; give a file path such as '
                     f'{os.path.join(path, "report.html")!r}')


def write_report(path: str, text: str) -> str:
  """Writes atomically (a temporary file, then rename) and returns the path; a failed write leaves the
  file that was there, and no temporary file."""
  check_report_path(path)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  files.write_atomically(path, text)
  return path
