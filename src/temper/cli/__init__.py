"""The `temper` command line."""
