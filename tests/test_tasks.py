"""Task generators against hand-worked examples, split sizes and disjointness, lengths and symbols."""

import json
import os

import numpy as np
import pytest

from symjax.tasks import base, induction, rasp


# ------------------------------------------------------------------------------------------------------
# Induction ("Learning Transformer Programs", Figure 5; its numbers 4 are outside our 0..3, so the second
# example uses 2 in their place).
# ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('sequence, last_tag', [('a1b2b2a', '1'), ('b3c2a3c', '2'), ('d2c0a2b', '<unk>')])
def test_induction_tags_match_the_papers_examples(sequence, last_tag):
  tags = induction.tag_sequence(list(sequence))
  assert tags[-1] == last_tag
  assert tags[1::2] == ['<pad>'] * 3  # numbers are ignored
  assert tags[0] == '<unk>'           # the first letter has no earlier occurrence


@pytest.fixture(scope='module')
def induction_task():
  return induction.InductionTask()


def test_induction_dataset(induction_task):
  data = induction_task.data
  sizes = {k: len(v) for k, v in data.inputs.items()}
  assert sizes == {'train': 16_200, 'validation': 1_800, 'test': 2_000}
  rows = {split: {tuple(r) for r in data.inputs[split]} for split in sizes}
  assert sum(len(r) for r in rows.values()) == 20_000  # distinct, and the splits are disjoint
  v = induction_task.vocab
  for row, tag in zip(data.inputs['train'][:500], data.targets['train'][:500]):
    tokens = v.decode(row)
    assert len(tokens) == 10 and tokens[0] == '<s>'
    assert v.decode(tag) == induction.tag_sequence(tokens)
    letters = [t for t in tokens if t in induction.LETTERS]
    assert len(letters) in (4, 5)


# ------------------------------------------------------------------------------------------------------
# RASP tags, worked by hand.
# ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('task, content, expected', [
    ('reverse', '0124', '4210'),
    ('sort', '3102', '0123'),
    ('hist', '0110', ['#2', '#2', '#2', '#2']),
    ('hist', '0112', ['#1', '#2', '#2', '#1']),
    ('double_hist', '0112', ['#2', '#1', '#1', '#2']),   # counts 1,2,2,1: two symbols have count 1
    ('double_hist', '5', ['#1']),
    ('most_freq', '0112', ['1', '0', '2', '<s>']),      # by count, ties by first position
    ('most_freq', '3300', ['3', '0', '<s>', '<s>']),
    ('dyck1', '()())', list('PTPTF')),                   # the paper's example
    ('dyck1', ')(()', list('FFFF')),                     # F from the first error to the end
    ('dyck2', '({})()', list('PPPTPT')),
    ('dyck2', '({)}', list('PPFF')),
])
def test_rasp_tags_match_hand_worked_examples(task, content, expected):
  assert rasp.tags(task, list(content)) == list(expected)


@pytest.fixture(scope='module', params=rasp.TASKS)
def rasp_task(request):
  return rasp.RaspTask(request.param)


def test_uniform_length_inputs_draw_every_content_length_alike(rasp_task):
  """Inputs drawn as the task defines them: each content length about as often as any other (the splits, which
  hold each input once, are mostly the longest), tagged as the task tags them; none for Dyck (one length)."""
  task = rasp_task
  batches = task.uniform_length_batches(count=1_200, batch_size=400)
  lo, hi = rasp.content_lengths(task.name, task.seq_len)
  if lo == hi:
    assert batches == []
    return
  inputs = np.concatenate([b['inputs'] for b in batches])
  assert inputs.shape == (1_200, task.seq_len)
  extra = 2 if task.name in ('reverse', 'sort') else 1      # <s>, and </s> for reverse and sort
  lengths = (inputs != task.pad_id).sum(1) - extra
  counts = np.bincount(lengths, minlength=hi + 1)[lo:]
  assert len(counts) == hi - lo + 1 and counts.min() > 0.5 * 1_200 / len(counts), counts
  test_lengths = (task.data.inputs['test'] != task.pad_id).sum(1) - extra
  assert np.mean(test_lengths == hi) > 2 * np.mean(lengths == hi)  # the split is mostly the longest
  for row, target in zip(inputs[:20], np.concatenate([b['targets'] for b in batches])[:20]):
    content = task.vocab.decode(row[1:1 + (row != task.pad_id).sum() - extra])
    want = rasp.tags(task.name, list(content))
    assert task.vocab.decode(target[1:1 + len(want)]) == want
  again = task.uniform_length_batches(count=1_200, batch_size=400)
  assert all((a['inputs'] == b['inputs']).all() for a, b in zip(batches, again))  # drawn from a fixed seed


def test_rasp_splits_are_disjoint_and_sized(rasp_task):
  data = rasp_task.data
  sizes = {k: len(data.inputs[k]) for k in ('train', 'validation', 'test')}
  if rasp_task.name in ('reverse', 'sort'):  # all 19,530 inputs of 5 symbols and length 1..6 exist
    assert sizes == {'train': 15_819, 'validation': 1_758, 'test': 1_953}
  else:
    assert sizes == {'train': 16_200, 'validation': 1_800, 'test': 2_000}
  rows = [{tuple(r) for r in data.inputs[k]} for k in sizes]
  assert sum(len(r) for r in rows) == sum(sizes.values())
  assert not (rows[0] & rows[1]) and not (rows[0] & rows[2]) and not (rows[1] & rows[2])


def test_rasp_lengths_symbols_and_tags_follow_the_table(rasp_task):
  name, v = rasp_task.name, rasp_task.vocab
  max_len = 16 if name.startswith('dyck') else 8
  assert rasp_task.causal == name.startswith('dyck')
  assert rasp_task.data.inputs['train'].shape[1] == max_len
  allowed = set(rasp.symbols(name))
  n_symbols = {'reverse': 5, 'sort': 5, 'hist': 6, 'double_hist': 6, 'most_freq': 6, 'dyck1': 2, 'dyck2': 4}
  assert len(allowed) == n_symbols[name]
  lengths = set()
  for row, tag in zip(rasp_task.data.inputs['train'][:3000], rasp_task.data.targets['train'][:3000]):
    tokens = [t for t in v.decode(row) if t != base.PAD]
    assert tokens[0] == base.BOS
    content = tokens[1:-1] if name in ('reverse', 'sort') else tokens[1:]
    if name in ('reverse', 'sort'):
      assert tokens[-1] == base.EOS
    assert set(content) <= allowed
    lengths.add(len(content))
    tags = v.decode(tag)
    assert tags[0] == base.PAD
    assert tags[1:1 + len(content)] == rasp.tags(name, content)
    assert all(t == base.PAD for t in tags[1 + len(content):])
  lo, hi = rasp.content_lengths(name, max_len)
  all_lengths = (rasp_task.data.inputs['train'] != v.id(base.PAD)).sum(1) - (2 if name in ('reverse', 'sort') else 1)
  assert all_lengths.min() == lo and all_lengths.max() == hi
  assert lengths <= set(range(lo, hi + 1))


def test_rasp_length_generalisation_splits(rasp_task):
  if rasp_task.causal:
    assert rasp_task.eval_splits == ()
    return
  assert rasp_task.eval_splits == ('length_12', 'length_16')
  train = {tuple(r) for r in rasp_task.data.inputs['train']}
  for n in (12, 16):
    inputs = rasp_task.data.inputs[f'length_{n}']
    assert inputs.shape == (2000, n)
    pad = rasp_task.vocab.id(base.PAD)
    assert (inputs != pad).sum(1).max() == n  # some sequences use the full new length
    assert not any(tuple(r[:8]) in train and (r[8:] == pad).all() for r in inputs)


def test_splits_longer_than_the_model_reads_are_left_out_of_the_final_evaluation_with_a_line(capsys):
  from symjax.model import ModelConfig
  from symjax.train import trainer
  task = rasp.RaspTask('most_freq')
  assert [task.split_length(s) for s in ('test', 'length_12', 'length_16')] == [8, 12, 16]
  model = lambda n: ModelConfig.of(kind='program', vocab_size=len(task.vocab), max_len=n)
  assert trainer.readable_eval_splits(task, model(16)) == ('length_12', 'length_16')
  assert capsys.readouterr().out == ''
  assert trainer.readable_eval_splits(task, model(12)) == ('length_12',)
  assert capsys.readouterr().out == 'not evaluated at the end: length_16 (sequences of 16 tokens; model.max_len = 12)\n'
  assert trainer.readable_eval_splits(task, model(8)) == ()
  assert 'length_12, length_16 (sequences of 12, 16 tokens; model.max_len = 8)' in capsys.readouterr().out


def test_a_task_built_again_in_a_process_shares_its_data_read_only_and_its_splits_are_its_own(monkeypatch):
  """The second build of a task with the same arguments generates nothing and holds the same arrays, which
  nothing can write into; a split one task adds is not another's. Other arguments generate their own data."""
  first = rasp.RaspTask('sort', data_seed=5)
  monkeypatch.setattr(rasp, '_generate', lambda *a: pytest.fail('generated a second time'))
  again = rasp.RaspTask('sort', data_seed=5)
  assert all(again.data.inputs[k] is first.data.inputs[k] for k in first.data.inputs)
  with pytest.raises(ValueError, match='read-only'):
    again.data.inputs['train'][0, 0] = 0
  again.data.inputs['mine'] = again.data.inputs['test']
  assert 'mine' not in first.data.inputs and 'mine' not in rasp.RaspTask('sort', data_seed=5).data.inputs
  with pytest.raises(pytest.fail.Exception, match='generated a second time'):
    rasp.RaspTask('sort', data_seed=6)
  monkeypatch.undo()
  other = rasp.RaspTask('sort', data_seed=6)
  assert not np.array_equal(other.data.inputs['test'], first.data.inputs['test'])


def test_length_balance_draws_each_length_by_its_weight_and_the_same_rows_on_a_resume():
  task = rasp.RaspTask('reverse')
  lengths = (task.data.inputs['train'] != task.pad_id).sum(1)
  counts = {n: int((lengths == n).sum()) for n in np.unique(lengths)}

  def drawn(steps=200):
    return np.concatenate([(task.batch('train', s, 64, 0)['inputs'] != task.pad_id).sum(1) for s in range(steps)])

  assert (drawn() == 3).mean() < 0.01  # shuffled epochs: one content token in 4 of 15,819 rows
  for a in (0.5, 1.0):
    task.length_balance = a
    share = {n: c ** (1 - a) for n, c in counts.items()}  # n_L rows, each drawn with weight n_L^(-a)
    expected = np.array([share[n] / sum(share.values()) for n in counts])
    seen = drawn()
    observed = np.array([(seen == n).mean() for n in counts])
    np.testing.assert_allclose(observed, expected, atol=0.02)  # 12,800 draws: binomial sd <= 0.0045
    np.testing.assert_array_equal(task.batch('train', 7, 64, 0)['inputs'], task.batch('train', 7, 64, 0)['inputs'])
    assert not np.array_equal(task.batch('train', 7, 64, 0)['inputs'], task.batch('train', 8, 64, 0)['inputs'])
  first = next(task.eval_batches('validation', 64, 0))['inputs']  # evaluation is never reweighted
  np.testing.assert_array_equal(first, task.data.inputs['validation'][:64])


def test_induction_input_space_is_every_sequence_the_task_generates(induction_task):
  inputs, exhaustive = induction_task.input_space()
  rows = {tuple(r) for r in inputs}
  assert exhaustive and inputs.shape == (133_760, 10) and len(rows) == 133_760
  assert all(tuple(r) in rows for split in ('train', 'validation', 'test') for r in induction_task.data.inputs[split])
  v = induction_task.vocab
  for row in inputs[::4099]:  # every one obeys its own letter -> number map and tags as the task does
    tokens = v.decode(row)
    letters = [t for t in tokens[1:] if t in induction.LETTERS]
    assert len(letters) in (4, 5) and tokens[0] == base.BOS
    pairs = tokens[2:] if tokens[1] in induction.NUMBERS else tokens[1:9]
    mapping = {}
    for letter, number in zip(pairs[::2], pairs[1::2]):
      assert mapping.setdefault(letter, number) == number


def test_dyck_inputs_are_biased_towards_balanced_prefixes():
  """Half the inputs start from a random balanced string, so long balanced prefixes (a T tag past
  position 8) are more common than among uniformly random brackets."""
  task = rasp.RaspTask('dyck1')
  v = task.vocab
  late_t = lambda tags: np.mean([any(t == 'T' for t in tg[8:]) for tg in tags])
  data = [v.decode(t)[1:] for t in task.data.targets['train']]
  rng = np.random.default_rng(1)
  uniform = [rasp.dyck_tags(list(rng.choice(['(', ')'], 15)), ('()',)) for _ in range(len(data))]
  assert late_t(data) > 1.2 * late_t(uniform)


# ------------------------------------------------------------------------------------------------------
# Text: nanoGPT's 90% training part, then disjoint validation and test parts.
# ------------------------------------------------------------------------------------------------------
def test_text_splits_are_disjoint_and_cover_the_corpus(tmp_path):
  from symjax.tasks.text import TextTask
  path = tmp_path / 'corpus.txt'
  text = ''.join(np.random.default_rng(0).choice(list('abcdefghijklmnopqrstuvwxyz'), 10_000))
  path.write_text(text, encoding='utf-8')
  task = TextTask(str(path), seq_len=8, eval_windows=64)
  sizes = {k: len(v) for k, v in task.streams.items()}
  assert sizes == {'train': 9_000, 'validation': 500, 'test': 500}
  joined = np.concatenate([task.streams[s] for s in base.SPLITS])
  assert task.tokenizer.decode(joined) == text   # in order, nothing shared, nothing dropped
  # Evaluation windows come from their own part and never from the other held-out one.
  windows_of = lambda stream: {tuple(stream[s:s + 8]) for s in range(len(stream) - 7)}
  for split, other in (('validation', 'test'), ('test', 'validation')):
    windows = {tuple(w) for b in task.eval_batches(split, 16, 0) for w in b['inputs']}
    assert windows <= windows_of(task.streams[split])
    assert not windows & windows_of(task.streams[other])


def test_char_tokenizer_encodes_each_character_to_its_id_and_names_unknown_ones():
  from symjax.tasks.text import CharTokenizer
  rng = np.random.default_rng(2)
  alphabet = list('ab \n') + ['é', '東', '🙂', '\ud800']   # two- to four-byte characters, a lone surrogate
  text = ''.join(rng.choice(alphabet, 2_000))
  tok = CharTokenizer(sorted(set(text)))
  ids = tok.encode(text)
  assert ids.dtype == np.int32
  np.testing.assert_array_equal(ids, [tok.vocab.index[c] for c in text])
  assert tok.decode(ids) == text and len(tok.encode('')) == 0
  # Characters outside the vocabulary, below, between and above its code points, are named in the error.
  with pytest.raises(ValueError, match=r"characters not in the vocabulary: \['\\t', 'c', '😀', '🚀'\]"):
    tok.encode('ab🚀😀c\t')


def test_text_too_short_for_its_held_out_parts_is_an_error(tmp_path):
  from symjax.tasks.text import TextTask
  path = tmp_path / 'short.txt'
  path.write_text('abcdefgh' * 40, encoding='utf-8')   # 320 chars: 16 for validation, 16 for test
  with pytest.raises(ValueError, match=r"its validation part has 16 tokens, fewer than seq_len \+ 2 = 34"):
    TextTask(str(path), seq_len=32)


# ------------------------------------------------------------------------------------------------------
# Text from a memory-mapped token folder (`python -m symjax.cli.tokenize`).
# ------------------------------------------------------------------------------------------------------
def multilingual_text(n: int) -> str:
  words = ['the', 'cat', 'résumé', 'naïve', '東京', 'κόσμε', '🙂', 'end.\n', 'line\n', ' ']
  return ' '.join(np.random.default_rng(3).choice(words, n))


def test_token_folder_gives_the_text_tasks_splits_and_batches(tmp_path):
  from symjax.tasks import text
  path = tmp_path / 'corpus.txt'
  path.write_text(multilingual_text(4_000), encoding='utf-8')
  # Small chunks: many chunk boundaries, some inside multi-byte characters of the UTF-8 file.
  meta = text.write_token_file(str(path), str(tmp_path / 'tokens'), chunk_chars=97)
  in_memory = text.TextTask(str(path), seq_len=16)
  mapped = text.TextTask('', seq_len=16, token_path=str(tmp_path / 'tokens'))
  assert isinstance(mapped.streams['train'], np.memmap) and meta['dtype'] == 'uint16'
  assert mapped.vocab.tokens == in_memory.vocab.tokens
  for split in base.SPLITS:
    np.testing.assert_array_equal(mapped.streams[split], in_memory.streams[split])
  for step in (0, 7):
    a, b = in_memory.batch('train', step, 8, 5), mapped.batch('train', step, 8, 5)
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
      assert a[k].dtype == b[k].dtype
  a, b = next(in_memory.eval_batches('test', 4, 0)), next(mapped.eval_batches('test', 4, 0))
  np.testing.assert_array_equal(a['inputs'], b['inputs'])


def whitespace_heavy_text(n: int) -> str:
  """Runs of spaces, blank lines, spaces before line ends, Windows line ends and Unicode spaces: where a
  piece boundary could change how a byte-level pre-tokenizer splits words."""
  pieces = ['word', 'x', ' ', '\n', '\n\n', ' \n', '\r\n', '\u3000', '\u2028', 'é', '12', "'s", '.', '\t', 'ÿ']
  return ''.join(np.random.default_rng(4).choice(pieces, n))


@pytest.mark.parametrize('tokenizer', ['char', 'bpe'])
def test_token_folder_tokenizes_as_the_text_task_does(tmp_path, tokenizer):
  """Same vocabulary (the same ids) and the same token stream from the folder as from the text, however
  the file is cut into pieces; Windows line ends are read as \\n by both."""
  from symjax.tasks import text
  corpus = whitespace_heavy_text(20_000)
  (tmp_path / 'c.txt').write_bytes(corpus.encode('utf-8'))
  in_memory = text.TextTask(str(tmp_path / 'c.txt'), seq_len=16, tokenizer=tokenizer, bpe_vocab_size=300)
  for chunk_chars in (97, 4096):
    folder = str(tmp_path / f'{tokenizer}_{chunk_chars}')
    text.write_token_file(str(tmp_path / 'c.txt'), folder, tokenizer, 300, chunk_chars=chunk_chars)
    tok, ids = text.open_token_file(folder)
    assert tok.to_json() == in_memory.tokenizer.to_json()
    # The fingerprint a resume compares: written with the folder, and computed for a folder without it.
    assert text.TextTask('', 16, token_path=folder).data_fingerprint == in_memory.data_fingerprint
    meta_path = os.path.join(folder, text.TOKEN_META)
    meta = json.load(open(meta_path))
    del meta['sha256']
    json.dump(meta, open(meta_path, 'w'))
    assert text.TextTask('', 16, token_path=folder).data_fingerprint == in_memory.data_fingerprint
    np.testing.assert_array_equal(ids, np.concatenate([in_memory.streams[s] for s in base.SPLITS]))
    assert tok.decode(np.asarray(ids)) == corpus.replace('\r\n', '\n').replace('\r', '\n')
  if tokenizer == 'char':
    assert '\r' not in in_memory.vocab.tokens
  else:
    assert len(tok.vocab) <= 300 and len(ids) < len(corpus)


def test_token_folder_errors_name_the_problem_and_overwrite_nothing(tmp_path):
  from symjax.tasks import text
  (tmp_path / 'c.txt').write_text('abc\n' * 500, encoding='utf-8')
  with pytest.raises(ValueError, match=r"lacks \['tokens.bin', 'meta.json', 'vocab.json'\]"):
    text.open_token_file(str(tmp_path / 'nothing'))
  text.write_token_file(str(tmp_path / 'c.txt'), str(tmp_path / 't'))
  before = (tmp_path / 't' / 'tokens.bin').read_bytes()
  with pytest.raises(ValueError, match='already holds a token file'):
    text.write_token_file(str(tmp_path / 'c.txt'), str(tmp_path / 't'))
  assert (tmp_path / 't' / 'tokens.bin').read_bytes() == before
  with open(tmp_path / 't' / 'tokens.bin', 'r+b') as f:
    f.truncate(len(before) - 2)
  with pytest.raises(ValueError, match='tokens.bin has 3998 bytes, meta.json says 2000 tokens'):
    text.open_token_file(str(tmp_path / 't'))
  with pytest.raises(ValueError, match='does not exist'):
    text.write_token_file(str(tmp_path / 'missing.txt'), str(tmp_path / 'u'))
  (tmp_path / 'latin1.txt').write_bytes('café\n'.encode('latin-1') * 10)
  with pytest.raises(ValueError, match='is not UTF-8 text'):
    text.write_token_file(str(tmp_path / 'latin1.txt'), str(tmp_path / 'v'))
  assert not os.path.exists(tmp_path / 'v' / 'tokens.bin')
  with pytest.raises(ValueError, match=r'bpe_vocab_size must be >= 256 \(a byte-level BPE'):
    text.write_token_file(str(tmp_path / 'c.txt'), str(tmp_path / 'w'), 'bpe', 100)
  assert not os.path.exists(tmp_path / 'w' / 'tokens.bin')


LARGE_CORPUS = r'''
import json, os, resource, sys
import numpy as np
folder, tokens = sys.argv[1], int(sys.argv[2])
os.makedirs(folder)
with open(os.path.join(folder, 'tokens.bin'), 'wb') as f:   # written in pieces: never all in memory
  for i in range(0, tokens, 1 << 24):
    f.write((np.arange(i, min(tokens, i + (1 << 24))) % 65).astype(np.uint16).tobytes())
json.dump({'dtype': 'uint16', 'count': tokens}, open(os.path.join(folder, 'meta.json'), 'w'))
json.dump({'type': 'char', 'tokens': [chr(48 + i) for i in range(65)]}, open(os.path.join(folder, 'vocab.json'), 'w'))
from symjax.tasks import text
# The process may allocate 256 MB more than its data segment holds now (VmData, what RLIMIT_DATA counts;
# not ru_maxrss, which a child inherits from a large parent): far less than the corpus.
with open('/proc/self/status') as f:
  used = next(int(line.split()[1]) * 1024 for line in f if line.startswith('VmData:'))
resource.setrlimit(resource.RLIMIT_DATA, (used + (256 << 20), resource.RLIM_INFINITY))
try:
  np.fromfile(os.path.join(folder, 'tokens.bin'), np.uint16)
  print('LOADED'); sys.exit(1)                                  # the limit would not bind: test is void
except MemoryError:
  pass
task = text.TextTask('', seq_len=64, token_path=folder)
for step in range(200):
  batch = task.batch('train', step, 12, 0)
  ok = (np.diff(batch['inputs'], axis=1) % 65 == 1).all() and (batch['targets'][:, :-1] == batch['inputs'][:, 1:]).all()
  assert ok, step
assert sum(1 for _ in task.eval_batches('test', 16, 0)) == 16
print('OK', len(task.streams['train']))
'''


@pytest.mark.slow
def test_corpus_larger_than_the_process_may_allocate_trains_from_the_map(tmp_path):
  """600 MB of tokens under a 256 MB allocation limit: loading it fails, batches from the map do not."""
  import subprocess
  import sys
  tokens = 300_000_000
  proc = subprocess.run([sys.executable, '-c', LARGE_CORPUS, str(tmp_path / 'big'), str(tokens)],
                        capture_output=True, text=True)
  assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
  assert proc.stdout.split() == ['OK', str(int(0.9 * tokens))]


PER_DEVICE_ROWS = r'''
import json, sys
import numpy as np
import jax
from symjax.system import mesh as mesh_lib
from symjax.tasks import text
task = text.TextTask('', seq_len=16, token_path=sys.argv[1])
reads = []
class Spy:  # the memory map, recording which windows are read
  def __init__(self, a): self.a = a
  def __len__(self): return len(self.a)
  def __getitem__(self, s): reads.append(s.start); return self.a[s]
task.streams['train'] = Spy(task.streams['train'])
batch = task.batch('train', 5, 8, 0)
assert not reads                                   # drawing a batch reads nothing
mesh = jax.make_mesh((4, 1), ('data', 'vocab'), axis_types=(jax.sharding.AxisType.Auto,) * 2)
placed = mesh_lib.batch_putter(mesh)(batch)
shards = [np.asarray(s.data) for s in placed['inputs'].addressable_shards]
print(json.dumps({'reads': len(reads), 'distinct': len(set(reads)), 'shard_rows': [len(s) for s in shards],
                  'equal': bool((np.asarray(placed['inputs']) == np.asarray(batch['inputs'])).all())}))
'''


def test_mapped_batches_are_read_row_by_row_where_they_are_placed(tmp_path):
  """Each of 4 devices gets 2 of 8 rows, and each row's input and target windows are read once: the reads
  follow the placement, so a process of a multi-host run reads only its own devices' rows."""
  import json
  import subprocess
  import sys

  from symjax.tasks import text
  (tmp_path / 'c.txt').write_text(multilingual_text(3_000), encoding='utf-8')
  text.write_token_file(str(tmp_path / 'c.txt'), str(tmp_path / 't'))
  mapped = text.TextTask('', seq_len=16, token_path=str(tmp_path / 't'))
  windows = mapped.batch('train', 5, 8, 0)['inputs']
  assert isinstance(windows, text.Windows) and windows.shape == (8, 16)
  np.testing.assert_array_equal(windows[2:4, 3:], np.asarray(windows)[2:4, 3:])
  np.testing.assert_array_equal(windows[1], np.asarray(windows)[1])
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=4')
  proc = subprocess.run([sys.executable, '-c', PER_DEVICE_ROWS, str(tmp_path / 't')], capture_output=True,
                        text=True, env=env)
  assert proc.returncode == 0, proc.stderr[-2000:]
  got = json.loads(proc.stdout.strip().splitlines()[-1])
  assert got == {'reads': 16, 'distinct': 16, 'shard_rows': [2, 2, 2, 2], 'equal': True}, got
