"""Names every side shares: labels, annotations, resource and DRA names, refusal reasons. Pure, stdlib only.

The culler and the notebook extension import from here and nowhere else in gpuspawner."""
