"""The TC path's connection tracking: listing, purging, and carrying it over an upgrade."""
