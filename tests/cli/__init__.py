"""The `mooncake` command line, run for real (its output, errors and subcommands)."""
