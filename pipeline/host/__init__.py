"""Host services benchseal starts and owns: the local OCI registry."""
