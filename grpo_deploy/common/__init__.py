"""The base both sides share, importing nothing else of the kit: validated values (values), strict schemas (strict),
how a value is shown in one line (shown), bounded reads that follow no link out (readback), tables, the directory
lock, and the events file (metrics)."""
