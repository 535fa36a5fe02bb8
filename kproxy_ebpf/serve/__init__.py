"""What the agent serves over HTTP: its health, the Services' health check ports, and metrics
(with kube-proxy's names)."""
