#!/usr/bin/env bash
# Keeps pyproject.toml's version floors true: installs the lowest version it allows of every runtime
# dependency into a fresh virtual environment, then trains a tiny symbolic model, resumes it from its
# checkpoint, and loads it back, from outside the clone with the recipe named as a plain install finds it.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python -m venv "$tmp/venv"
# "name>=v" -> "name==v" for every runtime dependency (jaxlib follows jax).
python - "$tmp/constraints.txt" <<'PY'
import re, sys, tomllib
deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']
pins = []
for dep in deps:
  name, floor = re.fullmatch(r'([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?>=([^,;\s]+)', dep.strip()).groups()
  pins.append(f'{name}=={floor}')
  if name == 'jax':
    pins.append(f'jaxlib=={floor}')
open(sys.argv[1], 'w').write('\n'.join(pins) + '\n')
print('floors:', ' '.join(pins))
PY
"$tmp/venv/bin/python" -m pip install -q --upgrade pip
"$tmp/venv/bin/python" -m pip install -q -c "$tmp/constraints.txt" .
"$tmp/venv/bin/python" -m pip list 2>/dev/null | grep -iE '^(jax|jaxlib|flax|optax|orbax-checkpoint|ml.collections|numpy) '
cd "$tmp"  # run the installed copy, not the source tree
run=(venv/bin/python -m symjax.main --config=symbolic:size=tiny --config.progress_bar=false
     --config.warmup_steps=5 --config.eval_every_steps=10 --config.log_every_steps=10 --workdir="$tmp/run")
"${run[@]}" --config.total_steps=20
"${run[@]}" --config.total_steps=30 | tee "$tmp/resume.log"
grep -q 'resuming from step 20' "$tmp/resume.log"
venv/bin/python -c "import symjax; r = symjax.load('$tmp/run'); print('loaded step', int(r.step))"
echo 'minimum versions: OK'
