"""The fault suite's bounded CI subset: one case of each kind from tests/fault_matrix.py and
tests/fault_faces.py, sized to run in about two minutes on two cores (the whole matrix, full
size: bench/faults.py).

Each test runs one case and asserts its verdict: 0 accepted messages lost, 0 duplicated,
and the case's own criteria, every one printed with what was measured when it fails. The
PostgreSQL halves of the process cases run in the throwaway database of
STRATAMEM_TEST_POSTGRES_URL; the restart case and the proxy's PostgreSQL outage need a
server they may stop, so they share a private cluster (initdb in a temporary directory, its
own port) and never touch that one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import fault_faces as ff
import fault_matrix as fm
from conftest import REQUIRE_POSTGRES

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

STREAM = fm.Stream(writers=3, before=30, after=30, timeout=90)
# The faces' cases (tests/fault_faces.py), smaller still: a dozen writes or calls a side.
FACES = fm.Stream(writers=3, before=12, after=12, timeout=60)


def _passes(row: fm.Row) -> None:
    assert row.ok, f"\n{fm.Row.HEADER}\n{row.report()}"


def test_serve_sigkill_mid_stream(db_url: str, tmp_path: Path) -> None:
    _passes(fm.serve_sigkill(db_url, tmp_path, STREAM))


def test_worker_sigkill_mid_stream(db_url: str, tmp_path: Path) -> None:
    _passes(fm.worker_sigkill(db_url, tmp_path, STREAM))


@pytest.fixture(scope="module")
def private_cluster() -> Iterator[fm.PrivateCluster]:
    if not fm.PrivateCluster.available():
        if REQUIRE_POSTGRES:
            pytest.fail("no PostgreSQL server binaries for a private cluster (STRATAMEM_PG_BIN)")
        pytest.skip("no PostgreSQL server binaries for a private cluster (STRATAMEM_PG_BIN)")
    with fm.PrivateCluster() as cluster:
        yield cluster


def test_postgres_restarted_mid_write(private_cluster: fm.PrivateCluster, tmp_path: Path) -> None:
    db_url = private_cluster.new_database("restart_fast")
    _passes(fm.postgres_restart(private_cluster, db_url, tmp_path, "fast", STREAM))


def test_llm_outage_then_recovery(tmp_path: Path) -> None:
    # Short backoffs (fm.SHORT_BACKOFF): 4 attempts fit in ~1.7 s, so 4 s of refused
    # connections outlast them; the row checks that it did.
    row = fm.llm_fault("unreachable", f"sqlite:///{tmp_path / 'm.db'}", fault_seconds=4.0)
    _passes(row)


def test_trickling_webhook_receiver(tmp_path: Path) -> None:
    # The receiver gives up after 10 s, which bounds the test when deliveries are not.
    row = fm.webhook_receiver_fault(
        "trickle-body", f"sqlite:///{tmp_path / 'm.db'}", tmp_path, trickle_seconds=10.0
    )
    _passes(row)


def test_four_processes_on_one_sqlite_file(tmp_path: Path) -> None:
    _passes(fm.sqlite_processes(tmp_path, processes=4, messages=40))


def test_close_right_after_captured_calls(tmp_path: Path) -> None:
    _passes(fm.capture_close(f"sqlite:///{tmp_path / 'm.db'}", calls=5))


def test_mcp_writes_through_a_sigkill_of_serve(tmp_path: Path) -> None:
    _passes(ff.mcp_serve_fault(f"sqlite:///{tmp_path / 'm.db'}", tmp_path, "kill", FACES))


def test_proxy_exchanges_through_a_sigterm_of_serve(tmp_path: Path) -> None:
    _passes(ff.proxy_serve_fault(f"sqlite:///{tmp_path / 'm.db'}", tmp_path, "term", FACES))


def test_proxy_with_a_key_check_that_cannot_answer(pg_url: str, tmp_path: Path) -> None:
    _passes(ff.proxy_slow_key_check(pg_url, tmp_path, hold_s=2.0, clients=2))


def test_proxy_through_a_postgres_outage(
    private_cluster: fm.PrivateCluster, tmp_path: Path
) -> None:
    db_url = private_cluster.new_database("proxy_outage")
    _passes(ff.proxy_postgres_outage(private_cluster, db_url, tmp_path, down_s=3.0, clients=2))


def test_erasure_racing_another_process(db_url: str, tmp_path: Path) -> None:
    _passes(ff.erasure_race(db_url, tmp_path))
