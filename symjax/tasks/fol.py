"""First-order-logic next-symbol prediction, from "Technical Architecture: FOL Symbolic Transformer".

Vocabulary (663 symbols): numerals 0-624 are ids 0-624; operators have the note's ids 625-654
(connectives, quantifiers, relations, structural, category, truth, meta-logic). The note leaves ids
655-662 unassigned; symjax uses them for its special tokens: 655 ``<pad>``, 656 ``<s>``, 657 ``</s>``,
658 ``<unk>``, and 659-662 reserved (never generated).

Names are compositional: a category token followed by base-625 digits, most significant first
(``VAR 1 2`` is x_627 = 1·625 + 2; x_5 is ``VAR 5``).

Formulas (``<s> formula </s>``) mix four levels: atomic 20%, simple compounds 40%, quantified 30%,
nested 10%. Every variable is bound by an enclosing quantifier; atoms outside any quantifier use
constants. Predicate and function k take 1 argument when k is odd, 2 when even — the arity the
validator checks.

Numeral glyphs: the note maps numeral n to a 25×25 binary grid "filled in row-major order", but its
examples disagree by one (1 fills one cell, 24 "the entire first row", 624 "all cells"). symjax's
bijection: glyph(n) has exactly its first n cells filled in row-major order — 0 is empty, 1 is the
top-left cell, 25 the whole first row, 624 every cell but the last. ``numeral_embeddings`` turns them
into initial embeddings.
"""

from __future__ import annotations

import numpy as np

from symjax.system.errors import InputError
from symjax.tasks import base

NUM_NUMERALS = 625
OPERATORS = ('NOT', 'AND', 'OR', 'IMPLIES', 'IFF',                                        # 625-629
             'FORALL', 'EXISTS', 'EXISTS1',                                              # 630-632
             'EQUALS', 'NOT_EQUALS', 'LESS_THAN', 'GREATER_THAN', 'LESS_EQUAL', 'GREATER_EQUAL',  # 633-638
             'LPAREN', 'RPAREN', 'COMMA', 'COLON', 'DOT',                                # 639-643
             'VAR', 'CONST', 'PRED', 'FUNC', 'SORT',                                     # 644-648
             'TRUE', 'FALSE',                                                            # 649-650
             'ENTAILS', 'MODELS', 'DEFINE', 'EQUIVALENT')                                # 651-654
SPECIALS = (base.PAD, base.BOS, base.EOS, base.UNK, '<reserved_0>', '<reserved_1>', '<reserved_2>',
            '<reserved_3>')                                                              # 655-662
CONNECTIVES = ('AND', 'OR', 'IMPLIES', 'IFF')
QUANTIFIERS = ('FORALL', 'EXISTS', 'EXISTS1')
RELATIONS = ('EQUALS', 'NOT_EQUALS', 'LESS_THAN', 'GREATER_THAN', 'LESS_EQUAL', 'GREATER_EQUAL')
LEVELS = {'atomic': 0.2, 'compound': 0.4, 'quantified': 0.3, 'nested': 0.1}
SEQ_LEN = 48


def vocab() -> base.Vocab:
  return base.Vocab([str(n) for n in range(NUM_NUMERALS)] + list(OPERATORS) + list(SPECIALS))


def digits(n: int) -> list[str]:
  """Base-625 digits of n >= 0, most significant first."""
  out = []
  while True:
    n, d = divmod(n, NUM_NUMERALS)
    out.append(str(d))
    if n == 0:
      return out[::-1]


def arity(k: int) -> int:
  return 1 if k % 2 else 2


def glyph(n: int) -> np.ndarray:
  """The 25×25 grid of numeral n: its first n cells, row-major, filled."""
  if not 0 <= n < NUM_NUMERALS:
    raise InputError(f'numerals are 0..624, got {n}')
  return (np.arange(NUM_NUMERALS) < n).reshape(25, 25)


def numeral_embeddings(d_model: int, std: float, seed: int = 0) -> np.ndarray:
  """[625, d_model] embeddings of the numerals from their glyphs: the ±1 grid through a fixed Gaussian
  projection, scaled to ``std`` per coordinate; grids that share cells get correlated embeddings."""
  grids = np.stack([glyph(n).reshape(-1) for n in range(NUM_NUMERALS)]).astype(np.float32) * 2 - 1
  projection = np.random.default_rng(seed).normal(size=(NUM_NUMERALS, d_model)).astype(np.float32)
  return grids @ projection * (std / np.sqrt(NUM_NUMERALS))


# ------------------------------------------------------------------------------------------------------
# Generation.
# ------------------------------------------------------------------------------------------------------
class Generator:
  def __init__(self, rng: np.random.Generator):
    self.rng = rng

  def index(self, small: int) -> int:
    """Mostly small indices; one in twenty is large, so multi-digit names occur."""
    return int(self.rng.integers(626, 2000)) if self.rng.random() < 0.05 else int(self.rng.integers(1, small + 1))

  def name(self, category: str, n: int) -> list[str]:
    return [category, *digits(n)]

  def term(self, bound: list[int], depth: int = 0) -> list[str]:
    r = self.rng.random()
    if bound and r < 0.7:
      return self.name('VAR', bound[self.rng.integers(len(bound))])
    if r < 0.9 or depth > 0:
      return self.name('CONST', self.index(9))
    k = self.index(4)
    return self.name('FUNC', k) + self.args(arity(k), bound, depth + 1)

  def args(self, n: int, bound: list[int], depth: int = 0) -> list[str]:
    out = ['LPAREN']
    for i in range(n):
      out += (['COMMA'] if i else []) + self.term(bound, depth)
    return out + ['RPAREN']

  def atom(self, bound: list[int]) -> list[str]:
    if self.rng.random() < 0.7:
      k = self.index(8)
      return self.name('PRED', k) + self.args(arity(k), bound)
    return self.term(bound) + [RELATIONS[self.rng.integers(len(RELATIONS))]] + self.term(bound)

  def compound(self, bound: list[int]) -> list[str]:
    if self.rng.random() < 0.3:
      return ['NOT', *self.atom(bound)]
    conn = CONNECTIVES[self.rng.integers(len(CONNECTIVES))]
    return ['LPAREN', *self.atom(bound), conn, *self.atom(bound), 'RPAREN']

  def new_variable(self, bound: list[int]) -> int:
    while True:
      v = self.index(6)
      if v not in bound:
        return v

  def quantified(self, bound: list[int]) -> list[str]:
    v = self.new_variable(bound)
    body = self.atom if self.rng.random() < 0.4 else self.compound
    return [QUANTIFIERS[self.rng.integers(len(QUANTIFIERS))], *self.name('VAR', v), *body(bound + [v])]

  def formula(self, depth: int, bound: list[int], max_depth: int = 3) -> list[str]:
    """The note's recursive generator: quantifier, connective or atom at each level."""
    if depth >= max_depth:
      return self.atom(bound)
    choice = self.rng.choice(['quantifier', 'connective', 'atomic'], p=[0.45, 0.4, 0.15])
    if choice == 'quantifier':
      v = self.new_variable(bound)
      return [QUANTIFIERS[self.rng.integers(len(QUANTIFIERS))], *self.name('VAR', v),
              *self.formula(depth + 1, bound + [v], max_depth)]
    if choice == 'connective':
      if self.rng.random() < 0.25:
        return ['NOT', *self.formula(depth + 1, bound, max_depth)]
      conn = CONNECTIVES[self.rng.integers(len(CONNECTIVES))]
      return ['LPAREN', *self.formula(depth + 1, bound, max_depth), conn,
              *self.formula(depth + 1, bound, max_depth), 'RPAREN']
    return self.atom(bound)

  def nested(self) -> list[str]:
    """A quantifier whose scope holds another quantifier (e.g. ∀x (P(x) → ∃y Q(x, y)))."""
    while True:
      f = self.formula(0, [])
      if sum(t in QUANTIFIERS for t in f) >= 2:
        return f

  def sample(self, level: str) -> list[str]:
    if level == 'atomic':
      return self.atom([])
    if level == 'compound':
      return self.compound([])
    if level == 'quantified':
      return self.quantified([])
    return self.nested()


# ------------------------------------------------------------------------------------------------------
# Validation: a recursive-descent parser of the grammar above.
# ------------------------------------------------------------------------------------------------------
class FOLSyntaxError(ValueError):
  pass


class Parser:
  def __init__(self, tokens: list[str]):
    self.tokens, self.i = tokens, 0

  def peek(self) -> str | None:
    return self.tokens[self.i] if self.i < len(self.tokens) else None

  def take(self, expected: str | None = None) -> str:
    tok = self.peek()
    if tok is None:
      raise FOLSyntaxError(f'formula ends early, expected {expected or "more"}')
    if expected is not None and tok != expected:
      raise FOLSyntaxError(f'expected {expected} at {self.i}, got {tok}')
    self.i += 1
    return tok

  def number(self) -> int:
    if self.peek() is None or not self.peek().isdigit():
      raise FOLSyntaxError(f'expected a numeral at {self.i}, got {self.peek()}')
    n = 0
    while self.peek() is not None and self.peek().isdigit():
      n = n * NUM_NUMERALS + int(self.take())
    return n

  def arguments(self, k: int, category: str, bound: list[int]) -> None:
    self.take('LPAREN')
    count = 0
    while True:
      self.term(bound)
      count += 1
      if self.peek() == 'COMMA':
        self.take()
        continue
      break
    self.take('RPAREN')
    if count != arity(k):
      raise FOLSyntaxError(f'{category} {k} takes {arity(k)} argument(s), got {count}')

  def term(self, bound: list[int]) -> None:
    tok = self.take()
    if tok == 'VAR':
      v = self.number()
      if v not in bound:
        raise FOLSyntaxError(f'variable x{v} is not bound by a quantifier')
    elif tok == 'CONST':
      self.number()
    elif tok == 'FUNC':
      self.arguments(self.number(), 'FUNC', bound)
    else:
      raise FOLSyntaxError(f'expected a term at {self.i - 1}, got {tok}')

  def atom(self, bound: list[int]) -> None:
    if self.peek() == 'PRED':
      self.take()
      self.arguments(self.number(), 'PRED', bound)
    elif self.peek() in ('TRUE', 'FALSE'):
      self.take()
    else:
      self.term(bound)
      rel = self.take()
      if rel not in RELATIONS:
        raise FOLSyntaxError(f'expected a relation at {self.i - 1}, got {rel}')
      self.term(bound)

  def formula(self, bound: list[int]) -> None:
    tok = self.peek()
    if tok == 'NOT':
      self.take()
      self.formula(bound)
    elif tok in QUANTIFIERS:
      self.take()
      self.take('VAR')
      self.formula(bound + [self.number()])
    elif tok == 'LPAREN':
      self.take()
      self.formula(bound)
      conn = self.take()
      if conn not in CONNECTIVES:
        raise FOLSyntaxError(f'expected a binary connective at {self.i - 1}, got {conn}')
      self.formula(bound)
      self.take('RPAREN')
    else:
      self.atom(bound)


def validate(tokens: list[str]) -> None:
  """Raises FOLSyntaxError unless ``tokens`` (without ``<s>``/``</s>``) is one well-formed, closed formula:
  balanced parentheses, connectives and predicates/functions with the right number of operands, every
  variable bound by an enclosing quantifier."""
  parser = Parser(list(tokens))
  parser.formula([])
  if parser.i != len(parser.tokens):
    raise FOLSyntaxError(f'extra tokens after the formula at {parser.i}: {parser.tokens[parser.i:][:5]}')


def is_valid(tokens: list[str]) -> bool:
  try:
    validate(tokens)
    return True
  except FOLSyntaxError:
    return False


class FOLTask(base.FixedSetTask):
  """Next-symbol prediction over ``<s> formula </s>``, padded to ``seq_len``."""

  name = 'fol'
  causal = True
  language_model = True

  def __init__(self, data_seed: int = 0, num_formulas: int = 20_000, seq_len: int = SEQ_LEN,
               numeral_glyph_init: bool = False):
    self.numeral_glyph_init = numeral_glyph_init
    self.vocab = vocab()
    self.pad_id = self.vocab.id(base.PAD)
    self.seq_len = seq_len
    rng = base.rng_for(data_seed, 'fol')
    gen = Generator(rng)
    # Distinct formulas in the stated mix: a quota per level (sampling levels at random and dropping
    # duplicates would under-represent the levels with fewer distinct formulas).
    seen: set[tuple[str, ...]] = set()
    self.levels: dict[tuple[str, ...], str] = {}
    for level, share in LEVELS.items():
      quota = len(seen) + round(share * num_formulas)
      while len(seen) < quota:
        f = tuple(gen.sample(level))
        if len(f) + 2 <= seq_len + 1 and f not in seen:
          seen.add(f)
          self.levels[f] = level
    formulas = sorted(seen)
    rows = np.full((len(formulas), seq_len + 1), self.pad_id, np.int32)
    for i, f in enumerate(formulas):
      ids = self.vocab.encode([base.BOS, *f, base.EOS])
      rows[i, :len(ids)] = ids
    self.data = base.split_distinct(rows[:, :-1], rows[:, 1:], rng)

  def initial_params(self, params, model_config):
    """With ``numeral_glyph_init``: the numerals' embedding rows (ids 0-624) from their 25×25 glyphs."""
    if not self.numeral_glyph_init:
      return None
    rows = numeral_embeddings(model_config.d_model, model_config.training.embed_init_std)
    embed = dict(params['embed'])
    embed['embedding'] = embed['embedding'].at[:NUM_NUMERALS].set(rows.astype(embed['embedding'].dtype))
    return {**params, 'embed': embed}
