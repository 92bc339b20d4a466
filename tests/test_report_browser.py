"""The HTML report in a real browser: Debian's chromium driven by Playwright with the system executable
(nothing downloaded at run time). CI installs both (.ci/run); elsewhere the test is skipped without them."""

import os
import shutil

import numpy as np
import pytest
from helpers import randomize, shapes_of, small

from symjax.interpret import core, report, tracing
from symjax.model import Transformer

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which('chromium') or shutil.which('chromium-browser')
CHARS = list('abcdefghij') + [' ', '\n', '<']                     # a space, a line end and an HTML character


def playwright():
  try:
    from playwright.sync_api import sync_playwright
  except ImportError:
    sync_playwright = None
  if CHROMIUM is None or sync_playwright is None:
    if os.environ.get('CI'):
      pytest.fail('CI needs Debian chromium and playwright: .ci/run installs them')
    pytest.skip('needs Debian chromium (apt-get install chromium) and playwright')
  return sync_playwright


def test_hovering_a_position_shows_its_exact_mixture_at_64_positions_and_no_token_is_blank(tmp_path):
  sync_playwright = playwright()
  cfg = small(kind='symbolic').replace(max_len=80)
  model = Transformer(cfg)
  tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, 70)
  tokens[3], tokens[4], tokens[5] = 10, 11, 12                   # ' ', '\n', '<'
  params = randomize(shapes_of(model, tokens[None])['params'], 3)
  decode = lambda ids: ''.join(CHARS[int(i)] for i in ids)
  path = tmp_path / 'report.html'
  path.write_text(report.build_report(model, params, tokens, decode, ig_steps=2), encoding='utf-8')
  trace = tracing.trace(core.analysis_model(model), params, tokens[None])
  weights = trace.mixture.x_e[2][0, 3, 0, :cfg.vocab_size]         # X_e after block 1, position 3, head 0
  expected = core.show_token(decode([int(np.argmax(weights))]))

  with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=CHROMIUM, args=['--no-sandbox'])
    page = browser.new_page(viewport={'width': 1400, 'height': 1100})
    errors = []
    page.on('pageerror', lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    page.hover('.tok[data-pos="3"]')
    state = page.locator('.state[data-state="after block 1, x_e"]')
    assert 'position 3 3:␣' in state.locator('h4').inner_text()
    shown = state.locator('.head').nth(0).locator('.exact .bar .t').first.inner_text()
    assert shown == expected
    labels = page.locator('.tok').all_inner_texts()
    assert len(labels) == 70 and all(label.split(':', 1)[1] for label in labels)
    assert labels[3:6] == ['3:␣', '4:⏎', '5:<']
    page.select_option('#head', '1.2')
    assert page.locator('#attn tbody tr').count() == 70 and page.locator('#attn thead th').count() == 71
    page.locator('#attn').scroll_into_view_if_needed()
    shot = tmp_path / 'report.png'
    page.hover('.tok[data-pos="3"]')
    page.evaluate('window.scrollTo(0, 0)')
    page.screenshot(path=str(shot))
    browser.close()
  assert not errors, errors
  assert shot.stat().st_size > 20_000
  print(f'screenshot: {shot}')
