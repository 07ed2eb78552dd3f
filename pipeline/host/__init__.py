"""The production infra host's setup: ``install`` (service user, directories, units, sudo rule,
policy) and ``api`` (how benchseal-api.service runs the API image)."""
