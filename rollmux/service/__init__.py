"""``rollmux serve``: the durable control plane behind an authenticated HTTP API."""
