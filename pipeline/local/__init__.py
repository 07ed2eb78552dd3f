"""The local world: embedded defaults that stand in for production services on one machine (the
private Sigstore instance, the scripted model, the local registries and token server, the local
chain of `release --local`). Production code never imports it (tests/test_structure.py); only
the CLI wires it in."""
