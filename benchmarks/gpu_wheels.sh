#!/bin/bash
# The wheels a borrowed GPU machine lacks, fetched here (where PyPI is reachable) into .whl/ for
# that machine's Python, to be carried over with the working tree (about 3 MB).
#
#   bash benchmarks/gpu_wheels.sh [PYTHON_VERSION]     # default 3.12, the GPU image's
#
# The GPU image has torch, numpy, sentencepiece, sacrebleu, pyyaml, tqdm, tensorboard,
# matplotlib, pandas, scipy, regex, click, joblib and the rest of /work/.library/device/KINDS.md's
# list; structnmt also imports sacremoses, conllu, nltk, submitit and deepsig (and these their
# dill and defusedxml), and Joey NMT 2.3.0 (the report's comparison) subword-nmt, mock and an
# importlib_metadata below 10 (10.x needs lazy_importer). spaCy is not needed: a study carries its
# dataset prepared and its trees in a file, and the report parses nothing. All of these are pure
# Python wheels. On the GPU machine, `source benchmarks/gpu_env.sh` installs them.
#
# Joey NMT 2.3.0 alone also needs sentencepiece 0.2.0: it calls SentencePieceProcessor.SetVocabulary,
# which later releases (the GPU image's among them) no longer have. That binary wheel goes to
# .whl/joey/, which gpu_env.sh puts on the path of Joey's commands only (JOEY_PYTHONPATH), so that
# structnmt keeps the image's sentencepiece.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-3.12}
wheels=(sacremoses==0.2.0 conllu==6.0.0 nltk==3.10.4 defusedxml==0.7.1 submitit==1.5.4 deepsig==1.2.8
        dill==0.4.1 joeynmt==2.3.0 subword-nmt==0.3.8 mock==5.2.0 'importlib_metadata==9.1.0')
fresh=$(mktemp -d .whl.new.XXXXXX)
trap 'rm -rf "$fresh"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$fresh" "${wheels[@]}"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$fresh/joey" sentencepiece==0.2.0
rm -rf .whl && mv "$fresh" .whl  # only once every wheel is here: a failed download keeps the old set
ls .whl .whl/joey
du -sh .whl
