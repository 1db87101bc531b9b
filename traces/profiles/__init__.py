"""Request-trace profiles (YAML files loaded by `traces.load_profile`)."""
