"""ironic-compute: share the nodes of one Ironic between compute services."""


def version_string():
    """The installed version (pbr), or 'unknown' when run from a tree."""
    try:
        from importlib import metadata
        return metadata.version('ironic-compute')
    except Exception:  # noqa: BLE001 - not installed: still report something
        return 'unknown'
