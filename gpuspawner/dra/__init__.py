"""Dynamic Resource Allocation: devices, device classes and claims -> DRA offerings and their free devices. Pure."""
