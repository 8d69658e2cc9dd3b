"""The benchmark's Django app: its job handler and the SQL-counting hook of the cluster."""
