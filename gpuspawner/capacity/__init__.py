"""Capacity and admission: free counts from the cluster index, the policy, quotas and the window -> quota -> capacity order. Pure."""
