"""On-call alerting: the console's side of paging through Alertmanager."""
