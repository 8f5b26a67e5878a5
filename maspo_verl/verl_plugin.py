"""Entry point in veRL's `verl.plugins` group: imported by every `import verl`, in every process.

veRL swallows exceptions raised here (logged at debug level only), so a failure is printed loudly on stderr before
it is re-raised. `MaspoPolicyLossConfig` imports this module again when veRL builds the config, which raises the
same error there, at config build time, instead of an "Unsupported loss mode" once training starts.
"""

from __future__ import annotations

import os
import sys
import traceback

CPU_SWITCH = "MASPO_VERL_CPU"


def _load() -> None:
    import maspo_verl.advantage  # noqa: F401 - registers adv_estimator=maspo
    import maspo_verl.loss  # noqa: F401 - registers loss_mode=maspo
    from maspo_verl import reward_metrics, verl_hooks

    verl_hooks.install()
    reward_metrics.install()
    if os.environ.get(CPU_SWITCH, "0") not in ("", "0"):
        from maspo_verl import cpu

        cpu.install()


try:
    _load()
except Exception:  # noqa: BLE001 - reported, then re-raised for veRL's own handler
    print(
        f"[maspo-verl] ERROR: the veRL plugin failed to load in process {os.getpid()}; loss_mode=maspo is not "
        f"available in it:\n{traceback.format_exc()}",
        file=sys.stderr,
    )
    raise
