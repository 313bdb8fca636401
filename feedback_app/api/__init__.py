"""The REST API: thin DRF views over the same plain functions the HTML views use."""
