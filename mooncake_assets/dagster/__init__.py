"""The Dagster layer of mooncake-assets: the only package of the project that imports Dagster.

==========================  ==================================================================
module                      what
==========================  ==================================================================
``definitions``             :class:`DagsterConfig`, ``load_config``, ``build_definitions``
                            (``mooncake_assets.definitions`` is the code location that
                            ``workspace.yaml`` loads)
``assets/``                 ``mirror/<t>`` and its maintenance assets, their asset checks, the
                            demo's downstream assets
``resources/``              ``ReplicationResource`` (the service's client) and
                            ``MooncakeDuckDBIOManager`` (dagster-duckdb's I/O manager, mirror
                            inputs read by union reads) with its type handlers
``sensors/``                ``replication_sensor``: keeps the service running, observes the
                            mirrors, asks for maintenance
``jobs/``                   maintenance jobs and their schedules
``compat``                  what this layer needs of Dagster that Dagster does not export
                            publicly, in one version-gated place
==========================  ==================================================================

The engine (``mooncake_assets.engine``) never imports this package.
"""
