"""A local Dask cluster for the tests that grade on one (tests/test_scale.py,
tests/test_record_cluster.py): import the fixture into the module (``from dask_cluster import
dask_cluster``); each module gets its own."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def dask_cluster():
    """Two worker processes, one thread each, the course's Dask settings (as docs/GRADING.md
    starts them); shared by a module's tests (a worker killed by one test is restarted by its
    nanny)."""
    distributed = pytest.importorskip("distributed")
    import dask

    from autograder.backends.cluster import grading_dask_config

    with dask.config.set(grading_dask_config()):
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                           dashboard_address=None, silence_logs=40)
    client = distributed.Client(cluster)
    try:
        yield cluster, client
    finally:
        client.close()
        cluster.close()
