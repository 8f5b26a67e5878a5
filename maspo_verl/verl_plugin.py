"""Entry point in veRL's `verl.plugins` group: imported by every `import verl`, in every process.

veRL swallows exceptions raised here (logged at debug level), so a failure is reported loudly on stderr and
kept in `LOAD_ERROR`; the MASPO config checks it at build time and raises with the original cause.
"""

from __future__ import annotations

import os
import sys
import traceback

LOAD_ERROR: str | None = None

CPU_SWITCH = "MASPO_VERL_CPU"


def _load() -> None:
    import maspo_verl.loss  # noqa: F401 - registers loss_mode=maspo
    from maspo_verl import verl_hooks

    verl_hooks.install()
    if os.environ.get(CPU_SWITCH, "0") not in ("", "0"):
        from maspo_verl import cpu

        cpu.install()


try:
    _load()
except Exception:  # noqa: BLE001 - reported, then re-raised for veRL's own handler
    LOAD_ERROR = traceback.format_exc()
    print(f"[maspo-verl] the veRL plugin failed to load in process {os.getpid()}:\n{LOAD_ERROR}", file=sys.stderr)
    raise
