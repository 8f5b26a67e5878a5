"""Which speech-token layout a checkpoint speaks: its ``speech_tokens.json`` is the one statement of it.

A checkpoint folder (what ``from_pretrained`` reads) may hold `LAYOUT_FILE`, ``{"layout": NAME, ...}``, naming a
registered layout (`maspo_base.speech_tokens.layouts`). A folder without one (a real Llasa-1B), a hub id or a path
this machine cannot read declares none, and is read as `DEFAULT_LAYOUT` (Llasa-1B's ids) unless a config names
another. Whoever needs a model's layout reads it here:

- the plugin's driver fills a run's ``codec.layout`` blocks from ``actor_rollout_ref.model.path``, and stops a run
  whose configured layout is not the checkpoint's (`maspo_verl.model_layout`);
- the lab builds models that declare theirs and reads it with the checkpoint's own ids
  (`maspo_lab.speaking_model.model.layout_of_checkpoint`).
"""

from __future__ import annotations

import json
from pathlib import Path

from .layouts import LLASA_1B

LAYOUT_FILE = "speech_tokens.json"
"""The file of a checkpoint folder that names its speech-token layout (``{"layout": "mini-llasa", ...}``)."""
DEFAULT_LAYOUT = LLASA_1B.name
"""The layout of a checkpoint that declares none, and of a config that names none: Llasa-1B's."""


def declared_layout(model_dir: str | Path) -> str | None:
    """The layout name ``model_dir``'s `LAYOUT_FILE` declares; None when it has none (a real Llasa-1B, a hub id).

    The name is not looked up here: a layout a user's module registers may not be imported yet; whoever reads the
    layout by name reports an unknown one. ``ValueError`` naming the file when it is not a mapping with ``layout``."""
    path = Path(model_dir) / LAYOUT_FILE
    if not path.is_file():
        return None
    try:
        name = json.loads(path.read_text()).get("layout")
    except (json.JSONDecodeError, AttributeError):
        name = None
    if not isinstance(name, str) or not name:
        raise ValueError(
            f'{path}: expected a JSON object with the model\'s layout name, e.g. {{"layout": "mini-llasa"}}'
        )
    return name


def checkpoint_layout_name(model_dir: str | Path) -> str:
    """The layout name ``model_dir`` speaks: the one it declares, `DEFAULT_LAYOUT` when it declares none."""
    return declared_layout(model_dir) or DEFAULT_LAYOUT
