"""Checksums of a checkpoint's files, so that damage that still decodes (one flipped byte in an array's data,
a changed digit in a JSON file) is found before the checkpoint is restored.

Orbax writes a step into ``checkpoints/<step>.orbax-checkpoint-tmp...`` and renames it to ``checkpoints/<step>``
when every process has finished. Just before the rename, on process 0, it calls the manager's
``post_finalization_callback``: ``seal_pending`` then writes ``checksums.json`` (the SHA-256 of every file) into
the temporary folder, so the manifest appears with the checkpoint, in the same rename. OCDBT and zarr keep no
checksum of their own as Orbax writes them, and a manifest covers Orbax's JSON files too.

Two files change after the manifest is written, both by Orbax's rename: ``_CHECKPOINT_METADATA`` gains the
commit time (its other fields are checked), and ``commit_success.txt`` is written (its text must name the
folder the manifest was written for). Each saved checkpoint also records ``{"checksums": "checksums.json"}``
in its ``custom_metadata``, so that a deleted manifest is told apart from a checkpoint written before symjax
kept checksums, which restores unverified.
"""

from __future__ import annotations

import hashlib
import json
import os

from symjax.system import files

MANIFEST = 'checksums.json'
CUSTOM_METADATA = {'checksums': MANIFEST}   # saved with each checkpoint (Orbax's custom_metadata)
STEP_METADATA = '_CHECKPOINT_METADATA'      # Orbax's; its commit time is written after the manifest
COMMIT_MARKER = 'commit_success.txt'        # Orbax's; written after the manifest
COMMIT_TEXT = 'Checkpoint commit was successful to {}'  # what Orbax writes in it
LATE_FIELDS = ('commit_timestamp_nsecs',)   # of STEP_METADATA, written at the rename
TMP_SUFFIX = '.orbax-checkpoint-tmp'


class ChecksumError(ValueError):
  """A checkpoint's file does not match the checksum written with it."""


def _digest(path: str) -> str:
  with open(path, 'rb') as f:
    return hashlib.file_digest(f, 'sha256').hexdigest()


def _step_metadata_digest(path: str) -> str:
  """SHA-256 of Orbax's step metadata without the fields its rename writes (canonical JSON)."""
  with open(path) as f:
    meta = json.load(f)
  if not isinstance(meta, dict):
    raise ValueError('not a JSON object')
  kept = {k: v for k, v in meta.items() if k not in LATE_FIELDS}
  return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()


def _files(folder: str) -> list[str]:
  """Every file under ``folder`` as a relative path with '/', except the manifest and the commit marker."""
  out = []
  for root, _, names in os.walk(folder):
    for name in names:
      rel = os.path.relpath(os.path.join(root, name), folder).replace(os.sep, '/')
      if rel not in (MANIFEST, COMMIT_MARKER):
        out.append(rel)
  return sorted(out)


def manifest(folder: str, final_path: str) -> dict:
  """The manifest of checkpoint folder ``folder`` that will be renamed to ``final_path``."""
  digests = {rel: (_step_metadata_digest if rel == STEP_METADATA else _digest)(os.path.join(folder, rel))
             for rel in _files(folder)}
  return {'version': 1, 'algorithm': 'sha256', 'final_path': final_path, 'files': digests}


def seal_pending(checkpoint_dir: str) -> None:
  """Writes the manifest of every checkpoint Orbax is about to commit in ``checkpoint_dir`` (its temporary
  folders). Orbax calls it on process 0 after every process has written its part."""
  if not os.path.isdir(checkpoint_dir):
    return
  for name in os.listdir(checkpoint_dir):
    step, sep, _ = name.partition(TMP_SUFFIX)
    folder = os.path.join(checkpoint_dir, name)
    if sep and step.isdigit() and os.path.isdir(folder) and not os.path.exists(os.path.join(folder, MANIFEST)):
      final = os.path.join(checkpoint_dir, step)
      files.write_atomically(os.path.join(folder, MANIFEST), json.dumps(manifest(folder, final), indent=0))


def written_with_checksums(folder: str) -> bool:
  """Whether the checkpoint in ``folder`` was saved by a symjax that writes manifests (its step metadata
  says so), whether or not the manifest is still there. Raises ``ChecksumError`` when the step metadata
  does not read."""
  try:
    with open(os.path.join(folder, STEP_METADATA)) as f:
      custom = json.load(f).get('custom_metadata') or {}
  except FileNotFoundError:
    return False
  except (OSError, ValueError, AttributeError) as e:
    raise ChecksumError(f'its {STEP_METADATA} does not read ({type(e).__name__})') from None
  return isinstance(custom, dict) and custom.get('checksums') == MANIFEST


def verify(folder: str) -> bool:
  """Checks every file of the checkpoint in ``folder`` against its manifest; raises ``ChecksumError`` naming
  the first file that differs, is missing or is extra. Returns False (nothing checked) for a checkpoint
  written before symjax kept checksums."""
  path = os.path.join(folder, MANIFEST)
  if not os.path.exists(path):
    if not _files(folder):  # emptied by damage, not written by an earlier symjax
      raise ChecksumError('it holds no files')
    if written_with_checksums(folder):
      raise ChecksumError(f'its {MANIFEST} is missing')
    return False
  try:
    with open(path) as f:
      saved = json.load(f)
    expected, final_path = dict(saved['files']), str(saved['final_path'])
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ChecksumError(f'its {MANIFEST} does not read ({type(e).__name__})') from None
  present = _files(folder)
  for rel in present:
    if rel not in expected:
      raise ChecksumError(f'file {rel} is not in its {MANIFEST}')
    try:
      got = (_step_metadata_digest if rel == STEP_METADATA else _digest)(os.path.join(folder, rel))
    except (OSError, ValueError) as e:
      raise ChecksumError(f'file {rel} does not read ({type(e).__name__})') from None
    if got != expected[rel]:
      raise ChecksumError(f'file {rel} does not match its checksum')
  missing = sorted(set(expected) - set(present))
  if missing:
    raise ChecksumError(f'file {missing[0]} is missing')
  marker = os.path.join(folder, COMMIT_MARKER)
  if os.path.exists(marker):  # Orbax writes it on every file system; its text names the committed folder
    try:
      with open(marker, encoding='utf-8') as f:
        text = f.read()
    except (OSError, ValueError) as e:
      raise ChecksumError(f'file {COMMIT_MARKER} does not read ({type(e).__name__})') from None
    if text != COMMIT_TEXT.format(final_path):
      raise ChecksumError(f'file {COMMIT_MARKER} does not match the folder its {MANIFEST} was written for')
  return True
