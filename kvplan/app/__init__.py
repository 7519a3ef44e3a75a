"""The command line and what it shows: commands, tables, plots, gates, startup-log import."""
