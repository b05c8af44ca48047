"""Studies that produce CSV tables and figures (``fp8sim study <name>``)."""
