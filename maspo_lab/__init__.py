"""The lab: the ``maspo-verl`` commands (`maspo_lab.cli`), run tooling (`maspo_lab.runs`), measurements and figures
(`maspo_lab.analysis`), the methods' vocabulary, and the testbeds (mini-llasa in `maspo_lab.speaking_model`, the
synthetic task in `maspo_lab.data`). Nothing here runs inside a veRL worker."""
