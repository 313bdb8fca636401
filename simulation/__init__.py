"""Simulated training data for the tests and benches: oracle-labelled episodes and the rows a crowd of scripted
annotators would give on them (`oracle_data`). Not shipped: the product packages never import it."""
