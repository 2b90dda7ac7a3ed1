"""The bridge to an upstream DiT4DiT checkout: validate it, build its commands, prepare its files, read its logs."""
