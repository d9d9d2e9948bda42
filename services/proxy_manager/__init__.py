"""The proxy-manager: leases a proxy for each fetch attempt over RPC."""
