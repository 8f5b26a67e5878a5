"""The speaking testbed: a small TTS model in Llasa-1B's format that really speaks, built offline on a CPU.

- `corpus`: English sentences from Debian's fortune files spoken by flite's voices (``maspo-verl build-corpus``);
- `maspo_base.mel_codec` and `codec_training`: one FSQ code per 20 ms frame, decoded by Griffin-Lim
  (``maspo-verl build-codec``);
- `model` and `training`: mini-llasa, a small Llama in Llasa's prompt format over 1,137 ids (``maspo-verl
  build-model``);
- `speaker`: saying texts with a checkpoint (``maspo-verl speak``); `hearing`: what Whisper tiny.en hears of it;
- `ear_training`: the code ear, phonemes heard in the codes themselves (``maspo-verl build-ear``).

The shipped checkpoint (model, codec and ear) lies in ``checkpoint/`` beside this file, with ``build.json`` saying which
commands, machine and time made it.
"""

from __future__ import annotations

from pathlib import Path

SHIPPED = Path(__file__).parent / "checkpoint"
SHIPPED_MODEL = SHIPPED / "model"
"""The shipped mini-llasa checkpoint (a ``from_pretrained`` folder with its ``speech_tokens.json``)."""
SHIPPED_CODEC = SHIPPED / "codec"
"""The shipped mini codec (`maspo_base.mel_codec.MelFsqCodec`)."""
SHIPPED_EAR = SHIPPED / "ear"
"""The shipped code ear (`reward_fns.code_ear.CodeEar`): phonemes heard in the mini codec's codes."""
