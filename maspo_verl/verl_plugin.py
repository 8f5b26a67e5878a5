"""Entry point in veRL's `verl.plugins` group: imported by every `import verl`, in every process.

Registers ``loss_mode=maspo`` (`maspo_verl.loss`) and ``adv_estimator=maspo`` (`maspo_verl.advantage`) and
installs the veRL patches (`maspo_verl.verl_patches`, the list of every veRL function wrapped). veRL swallows
exceptions raised here (logged at debug level only), so a failure is printed loudly on stderr before it is
re-raised. `maspo_verl.config.MaspoPolicyLossConfig` loads this entry point again when veRL builds the config
(`maspo_verl.plugin_loading.load_plugin`), which raises the same error there, at config build time, instead of an
"Unsupported loss mode" once training starts.
"""

from __future__ import annotations

import os
import sys
import traceback

CPU_SWITCH = "MASPO_VERL_CPU"


def _load() -> None:
    import maspo_verl.advantage  # noqa: F401 - registers adv_estimator=maspo
    import maspo_verl.loss  # noqa: F401 - registers loss_mode=maspo
    from maspo_verl import verl_patches

    verl_patches.install()
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
