"""Loading the plugin as veRL does, where veRL would swallow its failure: at config build time, in the driver."""

from __future__ import annotations

from maspo_base.typed_settings import SettingsError


class PluginNotInstalled(SettingsError):
    """maspo-verl's entry point is not installed in this environment."""


PLUGIN_ENTRY_POINT = ("verl.plugins", "maspo")
"""Where veRL finds the plugin (``pyproject.toml``'s ``[project.entry-points."verl.plugins"]``)."""


def load_plugin() -> None:
    """Load the plugin as veRL does (its entry point) unless it is loaded in this process already.

    The plugin registers ``loss_mode=maspo``, ``adv_estimator=maspo`` and installs the veRL patches; veRL swallows
    an exception raised while it loads a plugin, so this raises it again, at config build time, in the driver."""
    import sys
    from importlib.metadata import entry_points

    group, name = PLUGIN_ENTRY_POINT
    (entry_point,) = [ep for ep in entry_points(group=group) if ep.name == name] or [None]
    if entry_point is None:
        raise PluginNotInstalled(
            f"maspo-verl is not installed: no {name!r} entry point in {group!r} (pip install -e .)"
        )
    if entry_point.module not in sys.modules:
        entry_point.load()
