"""Memory pools."""
