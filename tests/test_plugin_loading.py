"""veRL loads the plugin by itself on `import verl`, lightly; a broken install is loud, not silent."""

import subprocess
import sys
import textwrap


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


def test_import_verl_alone_registers_maspo_and_stays_light(fresh_verl):
    result = fresh_verl("plugin")  # tests/conftest.py: a fresh interpreter, ``import verl`` first
    assert result["maspo_registered"]
    assert result["ppo_loss_wrapped"]
    assert not result["ray_initialized"]
    assert result["heavy_modules"] == []


def test_broken_plugin_is_reported_loudly_and_again_at_config_build():
    result = run_python(
        """
        import sys
        sys.modules["maspo_verl.segmentation.segment_ids"] = None  # simulate a broken install of one module
        import verl
        from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
        assert "maspo" not in POLICY_LOSS_REGISTRY
        print("verl imported")
        from hydra.utils import instantiate
        instantiate({"_target_": "maspo_verl.config.MaspoPolicyLossConfig", "loss_mode": "maspo"})
        """
    )
    assert "verl imported" in result.stdout
    assert "[maspo-verl] ERROR: the veRL plugin failed to load" in result.stderr
    assert result.returncode != 0
    at_config_build = result.stderr.split("loss_mode=maspo is not available in it:")[-1]
    assert "Error loading 'maspo_verl.config.MaspoPolicyLossConfig'" in at_config_build
    assert "import of maspo_verl.segmentation.segment_ids halted" in at_config_build


def test_importing_the_config_imports_neither_verl_nor_the_plugin():
    """veRL loads the plugin on its own import, and the plugin imports the config: a config that imported veRL
    would be met half-initialised by its own plugin (`import maspo_verl.config` first used to fail the plugin)."""
    result = run_python(
        """
        import sys
        import maspo_verl.config as config
        print(sorted(m for m in sys.modules if m == "verl" or m.startswith(("verl.", "maspo_verl.verl"))))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_module_that_loads_verl_first_still_gets_the_plugin():
    """`maspo_verl.rollout_correction` imports veRL, whose plugin loading imports the loss, which reads that same,
    half-imported module: the plugin must still load (it once failed here, leaving loss_mode=maspo unregistered)."""
    result = run_python(
        """
        import maspo_verl.rollout_correction
        from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
        assert "maspo" in POLICY_LOSS_REGISTRY
        print("registered")
        """
    )
    assert "failed to load" not in result.stderr, result.stderr[-2000:]
    assert "registered" in result.stdout, result.stderr[-2000:]
