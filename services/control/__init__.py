"""Control: the `hutch` command line (submit, run, status, export, sandbox, services)."""
