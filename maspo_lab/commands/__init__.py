"""The `maspo-verl` subcommands, one module each (registered in `maspo_lab.cli`)."""
