"""Host services benchseal starts and owns: the local OCI registry, and (tests, demo) registries
that demand credentials with the token server they trust (authregistry, tokenserver)."""
