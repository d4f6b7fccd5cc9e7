"""Pictures and tables of results: what a cluster owner reads."""
